# examples/custom_loop under torchrun: 2 ranks, ZeRO-2, bf16. Run A trains 12 steps saving
# at 6 and 12; run B starts from A's checkpoint-6 (--resume_from_checkpoint) into another
# folder and must end with A's weights, byte for byte. Checks the checkpoint holds the
# Trainer's files (one optimizer shard per rank) and that rank 0 alone printed.
include("${CMAKE_CURRENT_LIST_DIR}/example_outputs.cmake")
set(common --sharding zero2 --bf16 --max_steps 12 --logging_steps 4 --save_strategy steps --save_steps 6
           --max_train_samples 1024 --max_eval_samples 256 --per_device_train_batch_size 32
           --gradient_accumulation_steps 2)
set(root "${OUT}")
set(OUT "${root}/a")
run_torchrun(custom_loop "custom_loop: [0-9]+ training" ${common})
check_files("${OUT}" trainer_state.json all_results.json model.safetensors training_args.json
            checkpoint-6/model.safetensors checkpoint-6/optimizer-0-of-2.safetensors
            checkpoint-6/optimizer-1-of-2.safetensors checkpoint-6/scheduler.json checkpoint-6/scaler.json
            checkpoint-6/loop_state.json checkpoint-6/rng_state.safetensors checkpoint-6/trainer_state.json
            checkpoint-12/model.safetensors)
check_global_step("${OUT}" 12)
set(a "${OUT}")
set(OUT "${root}/b")
run_torchrun(custom_loop_resumed "custom_loop: resumed from [^\n]*checkpoint-6 at step 6" ${common}
             --resume_from_checkpoint "${a}/checkpoint-6")
check_global_step("${OUT}" 12)
file(SHA256 "${a}/model.safetensors" want)
file(SHA256 "${OUT}/model.safetensors" got)
if(NOT want STREQUAL got)
  message(FATAL_ERROR "the resumed run's weights differ from the uninterrupted run's")
endif()
file(READ "${a}/all_results.json" all)
string(JSON acc GET "${all}" eval_accuracy)
string(JSON turns GET "${all}" eval_rotation_accuracy)
message("custom loop ok: resumed weights equal; eval_accuracy ${acc}, eval_rotation_accuracy ${turns}")
