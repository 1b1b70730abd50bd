# The llama_dpo example, one process, on the fixture's tiny KJV preference folder (DATA), on a
# random 2-layer base: DPO with a LoRA adapter (the reference: the base with the adapter off),
# 4 steps with evaluations and checkpoints at 2 and 4; its first loss is ln 2, its evaluation
# logs TRL's eval_rewards/* metrics, and the same run resumed from checkpoint-2 logs the same
# losses after step 2. Full fine-tuning with the reference precomputed saves the whole model.
# --task reward trains a reward model whose folder transformers opens as a sequence classifier
# with one label, scoring the held-out pairs as loom reported. Refusals name their flags.
include("${CMAKE_CURRENT_LIST_DIR}/example_outputs.cmake")
set(base "${OUT}")
set(model --hidden_size 32 --intermediate_size 64 --num_hidden_layers 2 --num_attention_heads 4
          --num_key_value_heads 2 --max_length 64 --bf16 false)
set(flags --data_dir "${DATA}" --max_steps 4 --warmup_steps 1 --logging_steps 1 --eval_steps 2 --save_steps 2
          --learning_rate 5e-3 ${model})

set(OUT "${base}/lora")
run_example(llama_dpo ${flags} --lora_r 4)
check_global_step("${OUT}" 4)
check_files("${OUT}" adapter_config.json adapter_model.safetensors base/config.json tokenizer.json
            checkpoint-2/adapter_model.safetensors eval_results.json)
file(READ "${OUT}/trainer_state.json" state)
string(JSON first_loss GET "${state}" log_history 0 loss)
if(first_loss LESS 0.693146 OR first_loss GREATER 0.693148)
  message(FATAL_ERROR "the first DPO loss is ${first_loss}, not ln 2: the policy did not start as its reference")
endif()
file(READ "${OUT}/eval_results.json" results)
foreach(key eval_loss "eval_rewards/accuracies" "eval_rewards/margins" "eval_logps/chosen" eval_entropy)
  string(JSON value ERROR_VARIABLE missing GET "${results}" "${key}")
  if(missing)
    message(FATAL_ERROR "eval_results.json has no ${key}: ${results}")
  endif()
endforeach()
if(NOT out MATCHES "LoRA r=4")
  message(FATAL_ERROR "the banner does not show the adapter")
endif()

set(OUT "${base}/resumed")
run_example(llama_dpo ${flags} --lora_r 4 --resume_from_checkpoint "${base}/lora/checkpoint-2")
hf_check(resumed --straight "${base}/lora" --resumed "${base}/resumed" --from_step 2)

set(OUT "${base}/full")
run_example(llama_dpo ${flags} --use_peft false --precompute_ref_log_probs true --loss_type ipo --beta 0.5)
check_files("${OUT}" config.json model.safetensors eval_results.json)

set(OUT "${base}/reward")
run_example(llama_dpo --task reward --data_dir "${DATA}" --max_steps 4 --warmup_steps 1 --logging_steps 1
            --eval_strategy no --save_strategy no --learning_rate 5e-3 ${model})
check_files("${OUT}" config.json model.safetensors eval_results.json)
hf_check(reward_model --model "${OUT}" --data "${DATA}" --results "${OUT}/eval_results.json" --batch 8 --max_length 64)

set(OUT "${base}")
expect_loom_error("--task must be dpo or reward, got 'kto'" --data_dir "${DATA}" --task kto)
expect_loom_error("--loss_type 'sigmod' is not a DPO loss.*" --data_dir "${DATA}" --loss_type sigmod)
expect_loom_error("--sync_ref_model \\(TR-DPO\\) is not implemented by loom.*" --data_dir "${DATA}" --sync_ref_model true)
message("llama_dpo smoke ok")
