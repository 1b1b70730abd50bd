# The llama_dpo example under torchrun, 2 processes of 2 pairs a step, under DDP, ZeRO-2 and
# FullShard (units: the decoder layers), against one process of 4 pairs: DPO with LoRA (the
# reference: the base with the adapter off) and under FullShard full fine-tuning (the reference:
# a frozen copy) log the same loss and TRL's metrics at every step as the one process.
include("${CMAKE_CURRENT_LIST_DIR}/example_outputs.cmake")
set(base "${OUT}")
set(flags --data_dir "${DATA}" --max_steps 3 --warmup_steps 1 --logging_steps 1 --eval_strategy no
          --save_strategy no --learning_rate 5e-3 --hidden_size 32 --intermediate_size 64
          --num_hidden_layers 2 --num_attention_heads 4 --num_key_value_heads 2 --max_length 64 --bf16 false)
set(keys loss grad_norm "rewards/chosen" "rewards/rejected" "rewards/accuracies" "rewards/margins" "logps/chosen"
         "logps/rejected" "logits/chosen" entropy mean_token_accuracy num_tokens)
foreach(kind lora full)
  set(extra --lora_r 4)
  if(kind STREQUAL "full")
    set(extra --use_peft false)
  endif()
  set(OUT "${base}/${kind}_one")
  run_example(llama_dpo ${flags} ${extra} --per_device_train_batch_size 4 --use_cpu)
  set(dirs "${OUT}")
  set(policies ddp zero2 full_shard)
  if(kind STREQUAL "full")
    set(policies full_shard)
  endif()
  foreach(policy IN LISTS policies)
    set(OUT "${base}/${kind}_${policy}")
    run_torchrun("llama_dpo --sharding ${policy}" "llama_dpo: dpo of" --sharding ${policy} ${flags} ${extra}
                 --per_device_train_batch_size 2)
    check_global_step("${OUT}" 3)
    list(APPEND dirs "${OUT}")
  endforeach()
  hf_check(same_logs --keys ${keys} --rtol 1e-5 -- ${dirs})
endforeach()
message("torchrun llama_dpo ok")
