# The README's distributed command, shrunk: torchrun (from the project's venv) starts two
# ranks of the default example under ZeRO-2; its agent hosts the rendezvous store
# (TORCHELASTIC_USE_AGENT_STORE=True). Checks that the run ends, that only rank 0 printed
# and wrote the outputs, and that the checkpoint holds one optimizer shard per rank.
file(REMOVE_RECURSE "${OUT}")
execute_process(COMMAND "${TORCHRUN}" --standalone --nproc_per_node=2 --no-python "${EXE}"
                        --sharding zero2 --max_steps 20 --logging_steps 10 --max_train_samples 2560
                        --max_eval_samples 512 --save_strategy steps --save_steps 20 --use_cpu
                        --output_dir "${OUT}" --disable_tqdm
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 300)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "torchrun fashion_mnist exited with ${rc}")
endif()
string(REGEX MATCHALL "fashion_mnist: [0-9]+ training" banners "${out}")
list(LENGTH banners n)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "expected the banner from rank 0 only, got it ${n} times")
endif()
foreach(f trainer_state.json all_results.json checkpoint-20/model.safetensors
          checkpoint-20/optimizer-0-of-2.safetensors checkpoint-20/optimizer-1-of-2.safetensors)
  if(NOT EXISTS "${OUT}/${f}")
    message(FATAL_ERROR "missing ${OUT}/${f}")
  endif()
endforeach()
file(READ "${OUT}/all_results.json" all)
string(JSON acc GET "${all}" eval_accuracy)
message("torchrun zero2 ok: eval_accuracy ${acc}")
