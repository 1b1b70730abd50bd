# The llama_sft example under torchrun, 2 processes, under DDP, ZeRO-2 and FullShard (units:
# the decoder layers), 3 steps of LoRA on a random 2-layer base with packing, on the fixture's
# tiny KJV instruction folder (DATA). Each run prints its banner once, writes a checkpoint with
# the adapter (one optimizer shard per rank under ZeRO-2 and FullShard) and the final adapter;
# all three give the same train_loss and eval_loss and save the same adapter tensors. Then
# QLoRA (--load_in_4bit) under DDP and FullShard, the same losses on both.
include("${CMAKE_CURRENT_LIST_DIR}/example_outputs.cmake")
set(base "${OUT}")
set(dirs)
foreach(policy ddp zero2 full_shard)
  set(OUT "${base}/${policy}")
  run_torchrun("llama_sft --sharding ${policy}" "llama_sft: [0-9]+ training"
               --sharding ${policy} --data_dir "${DATA}" --max_steps 3 --warmup_steps 1 --logging_steps 1
               --eval_strategy no --save_steps 3 --hidden_size 32 --intermediate_size 64 --num_hidden_layers 2
               --num_attention_heads 4 --num_key_value_heads 2 --packing 128 --lora_r 4 --bf16 false)
  check_global_step("${OUT}" 3)
  check_files("${OUT}" adapter_config.json adapter_model.safetensors eval_results.json
              checkpoint-3/adapter_model.safetensors)
  if(NOT policy STREQUAL "ddp")
    check_files("${OUT}" checkpoint-3/optimizer-0-of-2.safetensors checkpoint-3/optimizer-1-of-2.safetensors)
  endif()
  list(APPEND dirs "${OUT}")
endforeach()
hf_check(same --keys train_loss eval_loss -- ${dirs})

# QLoRA under DDP and FullShard: the 4-bit base (held whole on each rank) under the adapter;
# both give the same losses and write the adapter.
set(qlora_dirs)
foreach(policy ddp full_shard)
  set(OUT "${base}/qlora_${policy}")
  run_torchrun("llama_sft --load_in_4bit --sharding ${policy}" "a nf4 base of 14 layers"
               --sharding ${policy} --load_in_4bit --use_bnb_nested_quant --data_dir "${DATA}" --max_steps 3
               --warmup_steps 1 --logging_steps 1 --eval_strategy no --save_steps 3 --hidden_size 32
               --intermediate_size 64 --num_hidden_layers 2 --num_attention_heads 4 --num_key_value_heads 2
               --packing 128 --lora_r 4 --bf16 false)
  check_global_step("${OUT}" 3)
  check_files("${OUT}" adapter_config.json adapter_model.safetensors eval_results.json)
  list(APPEND qlora_dirs "${OUT}")
endforeach()
hf_check(same --keys train_loss eval_loss -- ${qlora_dirs})
# Full fine-tuning under DDP and FullShard from the same random init: under FullShard the
# model is built without memory (loom::DeferredInit) and each rank materializes only its
# slices of the seeded initialization; the same losses as DDP's whole model.
set(full_dirs)
foreach(policy ddp full_shard)
  set(OUT "${base}/full_${policy}")
  if(policy STREQUAL "full_shard")
    set(banner "built without memory: each rank materializes its shards")
  else()
    set(banner "llama_sft: [0-9]+ training")
  endif()
  run_torchrun("llama_sft full fine-tuning --sharding ${policy}" "${banner}"
               --sharding ${policy} --data_dir "${DATA}" --max_steps 3 --warmup_steps 1 --logging_steps 1
               --eval_strategy no --save_strategy no --hidden_size 32 --intermediate_size 64 --num_hidden_layers 2
               --num_attention_heads 4 --num_key_value_heads 2 --packing 128 --bf16 false --use_peft false)
  check_files("${OUT}" model.safetensors config.json eval_results.json)
  list(APPEND full_dirs "${OUT}")
endforeach()
hf_check(same --keys train_loss eval_loss -- ${full_dirs})
message("torchrun llama_sft ok")
