# The README's distributed command, shrunk: torchrun (from the project's venv) starts two
# ranks of the default example under ZeRO-2; its agent hosts the rendezvous store
# (TORCHELASTIC_USE_AGENT_STORE=True). Checks that the run ends, that only rank 0 printed
# and wrote the outputs, and that the checkpoint holds one optimizer shard per rank.
include("${CMAKE_CURRENT_LIST_DIR}/example_outputs.cmake")
run_torchrun(fashion_mnist "fashion_mnist: [0-9]+ training"
             --sharding zero2 --max_steps 20 --logging_steps 10 --max_train_samples 2560
             --max_eval_samples 512 --save_strategy steps --save_steps 20)
check_files("${OUT}" trainer_state.json all_results.json checkpoint-20/model.safetensors
            checkpoint-20/optimizer-0-of-2.safetensors checkpoint-20/optimizer-1-of-2.safetensors)
file(READ "${OUT}/all_results.json" all)
string(JSON acc GET "${all}" eval_accuracy)
message("torchrun zero2 ok: eval_accuracy ${acc}")
