# The llama_sft example under torchrun, 2 processes, under DDP, ZeRO-2 and FullShard (units:
# the decoder layers), 3 steps of LoRA on a random 2-layer base with packing, on the fixture's
# tiny KJV instruction folder (DATA). Each run prints its banner once, writes a checkpoint with
# the adapter (one optimizer shard per rank under ZeRO-2 and FullShard) and the final adapter;
# all three give the same train_loss and eval_loss and save the same adapter tensors. Then
# QLoRA (--load_in_4bit) of the saved base as one process, under DDP and under FullShard (its
# 4-bit base sharded), the same losses and merged weights on all three. Then full
# fine-tuning (DDP eager, FullShard built without memory) and a base larger than --max_memory.
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

# QLoRA of the saved random base (the DDP run's <output_dir>/base) as one process with batch 8
# and at 2 ranks with batch 4 under DDP (each rank quantizes the whole base and keeps it) and
# FullShard (built without memory: each rank reads and quantizes one layer at a time from the
# folder and keeps its shard of the 4-bit bytes): the same losses (float noise: 2 ranks sum their
# gradients in another order than one batch; no adapter dropout, whose masks are drawn per
# rank), each FullShard rank holding about half the 4-bit bytes, and merged folders
# (--lora_save_merged, the 4-bit base dequantized, streamed unit by unit under FullShard) that
# transformers opens with the same weights: DDP's and FullShard's bitwise, one process's within
# float noise.
set(qlora_dirs)
set(merged_dirs)
set(qlora_flags --model_name_or_path "${base}/ddp/base" --load_in_4bit --use_bnb_nested_quant --data_dir "${DATA}"
                --max_steps 3 --warmup_steps 1 --logging_steps 1 --eval_strategy no --save_strategy no --packing 128
                --lora_r 4 --lora_dropout 0 --bf16 false --lora_save_merged)
set(OUT "${base}/qlora_one")
run_example("llama_sft --load_in_4bit" ${qlora_flags} --per_device_train_batch_size 8 --use_cpu)
string(REGEX MATCH "rank 0 holds the 4-bit base in ([0-9]+) bytes" held "${out}")
set(one_bytes "${CMAKE_MATCH_1}")
if(NOT one_bytes)
  message(FATAL_ERROR "one process did not print the bytes of its 4-bit base")
endif()
list(APPEND qlora_dirs "${OUT}")
list(APPEND merged_dirs "${OUT}/merged")
foreach(policy ddp full_shard)
  set(OUT "${base}/qlora_${policy}")
  run_torchrun("llama_sft --load_in_4bit --sharding ${policy}" "a nf4 base of 14 layers"
               --sharding ${policy} ${qlora_flags})
  check_files("${OUT}" adapter_config.json adapter_model.safetensors eval_results.json merged/model.safetensors)
  string(REGEX MATCHALL "rank [01] holds the 4-bit base in [0-9]+ bytes" lines "${out}")
  list(LENGTH lines n)
  if(NOT n EQUAL 2)
    message(FATAL_ERROR "${policy}: expected each of the 2 ranks to print its 4-bit bytes, got ${n} lines")
  endif()
  foreach(line IN LISTS lines)
    string(REGEX REPLACE ".* in ([0-9]+) bytes" "\\1" bytes "${line}")
    math(EXPR permille "${bytes} * 1000 / ${one_bytes}")
    message("QLoRA --sharding ${policy}: ${line} (${permille} per mille of one process's ${one_bytes})")
    if(policy STREQUAL "ddp" AND NOT bytes EQUAL one_bytes)
      message(FATAL_ERROR "DDP keeps the whole 4-bit base on each rank: ${bytes} bytes, one process ${one_bytes}")
    endif()
    # Half, and the padding of each tensor to 4 bytes and of each unit to 2 ranks.
    if(policy STREQUAL "full_shard" AND (permille LESS 495 OR permille GREATER 505))
      message(FATAL_ERROR "FullShard: a rank holds ${bytes} bytes of the 4-bit base, not about half of ${one_bytes}")
    endif()
  endforeach()
  list(APPEND qlora_dirs "${OUT}")
  list(APPEND merged_dirs "${OUT}/merged")
endforeach()
hf_check(same --keys train_loss eval_loss -- ${qlora_dirs})
hf_check(same_weights --rtol 1e-5 --bitwise "${base}/qlora_ddp/merged" "${base}/qlora_full_shard/merged" -- ${merged_dirs})
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
# A base larger than the memory each process is told it has (--max_memory 35MiB against a
# 43 MB float32 model, 16 layers of width 256): LoRA under FullShard at 2 ranks builds it
# without memory, shards the frozen base and trains; DDP, which keeps the base whole on every
# rank, is refused by the memory plan before anything is allocated.
set(OUT "${base}/max_memory_base")
file(REMOVE_RECURSE "${OUT}")
execute_process(COMMAND "${EXE}" --data_dir "${DATA}" --use_cpu --disable_tqdm --output_dir "${OUT}" --max_steps 1
                        --eval_strategy no --save_strategy no --hidden_size 256 --intermediate_size 512
                        --num_hidden_layers 16 --num_attention_heads 4 --num_key_value_heads 4 --packing 32
                        --bf16 false --use_peft false --do_train --per_device_train_batch_size 1
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err TIMEOUT 300)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "making the 43 MB base failed: ${err}")
endif()
file(SIZE "${OUT}/model.safetensors" model_bytes)
if(model_bytes LESS 36700160)  # 35 MiB
  message(FATAL_ERROR "the base holds ${model_bytes} bytes, not more than --max_memory 35MiB")
endif()
set(max_memory_flags --model_name_or_path "${OUT}" --data_dir "${DATA}" --max_steps 2 --logging_steps 1
                     --eval_strategy no --save_strategy no --packing 32 --bf16 false --do_train
                     --per_device_train_batch_size 1 --gradient_checkpointing --max_memory 35MiB)
set(OUT "${base}/max_memory_full_shard")
run_torchrun("llama_sft --max_memory 35MiB --sharding full_shard" "built without memory: each rank materializes its shards"
             --sharding full_shard ${max_memory_flags})
check_files("${OUT}" adapter_model.safetensors train_results.json)
set(OUT "${base}/max_memory_ddp")
file(REMOVE_RECURSE "${OUT}")
execute_process(COMMAND "${TORCHRUN}" --standalone --nproc_per_node=2 --no-python "${EXE}" --sharding ddp ${max_memory_flags}
                        --use_cpu --output_dir "${OUT}" --disable_tqdm
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 300)
if(rc EQUAL 0 OR NOT err MATCHES "loom: the memory plan needs [0-9.]+ MiB per process \\(frozen parameters 41.*shard the frozen parameters \\(--sharding full_shard")
  message(FATAL_ERROR "DDP with --max_memory 35MiB was not refused by the memory plan (exit ${rc}):\n${out}${err}")
endif()
message("DDP refused: the memory plan's frozen base is whole on each rank")
message("torchrun llama_sft ok")
