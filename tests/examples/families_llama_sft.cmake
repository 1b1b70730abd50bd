# llama_sft on every family loom's Llama architecture reads (issue 40): one Python process saves a
# tiny random folder of each with transformers (tests/hf/compare.py's facts, the fixture's 512-id
# vocabulary); for each, llama_sft trains a LoRA adapter on PEFT's default targets for a few steps
# on the fixture's KJV instructions and writes the merged folder, then generates from that merged
# folder (--prompt, and --predict_file in one left-padded batch); for three families, a full
# fine-tuning run trains and then completes the prompt. A second Python process checks them all
# (hf_examples_check.py families): PEFT opens each adapter onto its folder with the merged
# folder's logits, and transformers' greedy generate gives every completion loom printed or wrote.
# Where PEFT has no default targets (phi3, qwen3_moe), loom refuses the run as PEFT does, and it is
# run again with the targets named below. fp32 (the example's bf16 is covered by the llama smoke).
include("${CMAKE_CURRENT_LIST_DIR}/example_outputs.cmake")
set(base "${OUT}")
file(REMOVE_RECURSE "${base}")
set(folders "${base}/folders")
hf_check(family_folders --data "${DATA}" --out "${folders}")
file(GLOB families LIST_DIRECTORIES true RELATIVE "${folders}" "${folders}/*")
list(LENGTH families count)
if(count LESS 10)
  message(FATAL_ERROR "expected a folder of each of the 10 families in ${folders}, got ${families}")
endif()

# The targets given where PEFT has none (its TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING):
# Phi-3's fused attention projection, and Qwen3-MoE's q and v as for its dense sibling.
set(targets_phi3 qkv_proj)
set(targets_qwen3_moe q_proj,v_proj)
set(full_fine_tuning gemma2 phi3 qwen3_moe)  # tied embeddings and soft-caps, fused projections, experts

set(prompt "Genesis 1:3")
set(max_new_tokens 12)
file(WRITE "${base}/prompts.jsonl" "{\"prompt\": \"Genesis 1:3\"}\n"
     "{\"prompt\": \"In the beginning God created the heaven and the earth.\"}\n{\"prompt\": \"John 3:16\"}\n")
set(train --data_dir "${DATA}" --do_train --max_steps 3 --logging_steps 1 --eval_strategy no --save_strategy no
          --packing 64 --per_device_train_batch_size 2 --bf16 false --warmup_steps 0 --learning_rate 1e-2)
foreach(family IN LISTS families)
  set(runs "${base}/${family}")
  set(lora --lora_r 4 --lora_save_merged)
  # PEFT's default targets, or loom's refusal where PEFT has none (kept for the check).
  execute_process(COMMAND "${EXE}" ${train} ${lora} --model_name_or_path "${folders}/${family}"
                          --output_dir "${runs}/lora" --disable_tqdm
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(rc EQUAL 2 AND err MATCHES "^loom: --use_peft: PEFT has no default target modules for model type")
    if(NOT DEFINED targets_${family})
      message(FATAL_ERROR "${family}: loom refused PEFT's default targets and this test names none:\n${err}")
    endif()
    file(WRITE "${runs}/refused.log" "${err}")
    set(OUT "${runs}/lora")
    run_example(llama_sft ${train} ${lora} --lora_target_modules ${targets_${family}}
                --model_name_or_path "${folders}/${family}")
  elseif(NOT rc EQUAL 0)
    message(FATAL_ERROR "llama_sft on the ${family} folder exited with ${rc}")
  endif()
  check_files("${runs}/lora" adapter_config.json adapter_model.safetensors merged/config.json merged/model.safetensors)
  # Generation only, from the merged folder: the prompt, then the prompts file in one batch.
  set(OUT "${runs}/generate")
  run_example(llama_sft --data_dir "${DATA}" --model_name_or_path "${runs}/lora/merged" --use_peft false
              --prompt "${prompt}" --predict_file "${base}/prompts.jsonl" --max_new_tokens ${max_new_tokens}
              --per_device_eval_batch_size 3)
  file(WRITE "${runs}/generate.log" "${out}")
  list(FIND full_fine_tuning "${family}" full)
  if(full GREATER -1)
    set(OUT "${runs}/full")
    run_example(llama_sft ${train} --use_peft false --model_name_or_path "${folders}/${family}"
                --prompt "${prompt}" --max_new_tokens ${max_new_tokens})
    file(WRITE "${runs}/full.log" "${out}")
    check_global_step("${OUT}" 3)
  endif()
endforeach()

hf_check(families --folders "${folders}" --runs "${base}" --data "${DATA}" --prompt "${prompt}"
         --prompts "${base}/prompts.jsonl" --max_new_tokens ${max_new_tokens})
message("llama_sft families ok")
