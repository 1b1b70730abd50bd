# The README's distributed command, shrunk: torchrun (from the project's venv) starts two
# ranks of the default example under ZeRO-2; its agent hosts the rendezvous store
# (TORCHELASTIC_USE_AGENT_STORE=True). Checks that the run ends, that only rank 0 printed
# and wrote the outputs, and that the checkpoint holds one optimizer shard per rank. Then
# transformers' documented ZeRO-2 and ZeRO-3 DeepSpeed configs, unchanged, under --fp16.
include("${CMAKE_CURRENT_LIST_DIR}/example_outputs.cmake")
set(base "${OUT}")
set(OUT "${base}/zero2")
run_torchrun(fashion_mnist "fashion_mnist: [0-9]+ training"
             --sharding zero2 --max_steps 20 --logging_steps 10 --max_train_samples 2560
             --max_eval_samples 512 --save_strategy steps --save_steps 20)
check_files("${OUT}" trainer_state.json all_results.json checkpoint-20/model.safetensors
            checkpoint-20/optimizer-0-of-2.safetensors checkpoint-20/optimizer-1-of-2.safetensors)
file(READ "${OUT}/all_results.json" all)
string(JSON acc GET "${all}" eval_accuracy)

# The stage picks the sharding, the offload sections host-memory optimizer steps (and ZeRO-3's
# parameter shards), the fp16 section DeepSpeed's loss scale rule, the scheduler section
# DeepSpeed's WarmupLR ("auto": from 0 to --learning_rate over --warmup_steps, log-shaped).
foreach(stage 2 3)
  set(OUT "${base}/ds_zero${stage}")
  run_torchrun(fashion_mnist "fashion_mnist: [0-9]+ training"
               --deepspeed "${CMAKE_CURRENT_LIST_DIR}/deepspeed/ds_config_zero${stage}.json" --fp16
               --max_steps 8 --warmup_steps 4 --logging_steps 1 --max_train_samples 1024 --max_eval_samples 128
               --save_strategy steps --save_steps 8)
  file(READ "${OUT}/training_args.json" targs)
  string(JSON sharding GET "${targs}" sharding)
  string(JSON rule GET "${targs}" loss_scale_rule)
  string(JSON schedule GET "${targs}" lr_scheduler_type)
  string(JSON lr GET "${targs}" learning_rate)
  if(stage EQUAL 2)
    set(want zero2)
  else()
    set(want full_shard)
  endif()
  if(NOT sharding STREQUAL want OR NOT rule STREQUAL "deepspeed" OR NOT schedule STREQUAL "warmup_lr")
    message(FATAL_ERROR "ZeRO-${stage} config: --sharding ${sharding}, --loss_scale_rule ${rule}, "
                        "--lr_scheduler_type ${schedule}; expected ${want}, deepspeed, warmup_lr")
  endif()
  file(READ "${OUT}/checkpoint-8/scaler.json" scaler)
  string(JSON scaler_rule GET "${scaler}" rule)
  string(JSON window GET "${scaler}" scale_window)
  string(JSON hysteresis GET "${scaler}" delayed_shift)
  if(NOT scaler_rule STREQUAL "deepspeed" OR NOT window EQUAL 1000 OR NOT hysteresis EQUAL 2)
    message(FATAL_ERROR "checkpoint-8/scaler.json: ${scaler}")
  endif()
  # WarmupLR: the rate after the first step is warmup_min_lr (0); after the warmup, the peak.
  file(READ "${OUT}/trainer_state.json" state)
  string(JSON first GET "${state}" log_history 0 learning_rate)
  string(JSON last GET "${state}" log_history 7 learning_rate)
  if(NOT first EQUAL 0 OR NOT last EQUAL lr)
    message(FATAL_ERROR "ZeRO-${stage}: learning rates ${first} after step 1 and ${last} after step 8, expected 0 "
                        "and ${lr}")
  endif()
  message("deepspeed zero${stage} config ok")
endforeach()
message("torchrun zero2 ok: eval_accuracy ${acc}")
