# The gpt2 example under torchrun, 2 processes, once per sharding policy (DDP, ZeRO-1, ZeRO-2,
# FullShard, whose units are the transformer blocks), 3 steps of a 2-block model on the
# fixture's tiny KJV folder (DATA). Each run must end, print its banner once (rank 0), write a
# checkpoint (one optimizer shard per rank under ZeRO and FullShard) and the final HF folder;
# all four must give the same train_loss and eval_loss and save the same full tensors.
include("${CMAKE_CURRENT_LIST_DIR}/example_outputs.cmake")
set(base "${OUT}")
set(dirs)
foreach(policy ddp zero1 zero2 full_shard)
  set(OUT "${base}/${policy}")
  run_torchrun("gpt2 --sharding ${policy}" "gpt2: [0-9]+ training"
               --sharding ${policy} --data_dir "${DATA}" --max_steps 3 --warmup_steps 1 --logging_steps 1
               --eval_strategy no --save_steps 3 --n_layer 2 --n_head 2 --n_embd 32 --block_size 32)
  check_global_step("${OUT}" 3)
  check_files("${OUT}" config.json model.safetensors eval_results.json checkpoint-3/model.safetensors)
  if(NOT policy STREQUAL "ddp")
    check_files("${OUT}" checkpoint-3/optimizer-0-of-2.safetensors checkpoint-3/optimizer-1-of-2.safetensors)
  endif()
  list(APPEND dirs "${OUT}")
endforeach()
hf_check(same --keys train_loss eval_loss -- ${dirs})
message("torchrun gpt2 ok")
