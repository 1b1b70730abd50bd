# The llama_sft example, one process, on the fixture's tiny KJV instruction folder (DATA): a
# random 2-layer base with a LoRA adapter, bf16 and packing (its defaults), 6 steps with
# evaluations and checkpoints at 3 and 6. Checkpoints and the output folder hold PEFT's
# adapter files and never the base's weights; the random base is saved in base/. The same run
# resumed from checkpoint-3 logs the same losses after step 3. PEFT opens the adapter onto the
# base with the merged folder's logits, and gets, in fp32, the held-out completion loss that
# loom reports from the base and the adapter (--lora_adapter, one unpacked example a batch).
# --predict_with_generate on the merged folder reports the exact match (of the decoded texts, and
# token for token) that transformers' greedy generate gives on the same prompts, and writes
# each row's completion and reference, and --prompt prints the completion transformers gives.
include("${CMAKE_CURRENT_LIST_DIR}/example_outputs.cmake")
set(base "${OUT}")
set(flags --data_dir "${DATA}" --max_steps 6 --warmup_steps 1 --logging_steps 1 --eval_steps 3 --save_steps 3
          --hidden_size 32 --intermediate_size 64 --num_hidden_layers 2 --num_attention_heads 4
          --num_key_value_heads 2 --packing 128 --lora_r 4 --lora_save_merged)

set(OUT "${base}/straight")
run_example(llama_sft ${flags})
check_global_step("${OUT}" 6)
check_files("${OUT}" adapter_config.json adapter_model.safetensors tokenizer.json all_results.json
            checkpoint-3/adapter_model.safetensors checkpoint-3/optimizer.safetensors checkpoint-6/trainer_state.json
            base/config.json base/model.safetensors merged/config.json merged/model.safetensors)
foreach(f model.safetensors checkpoint-3/model.safetensors checkpoint-3/config.json)
  if(EXISTS "${OUT}/${f}")
    message(FATAL_ERROR "a LoRA run wrote ${OUT}/${f}: the frozen base belongs in base/ only")
  endif()
endforeach()
file(READ "${OUT}/training_args.json" training_args)
string(JSON bf16 GET "${training_args}" bf16)
if(NOT bf16)
  message(FATAL_ERROR "the default run did not train in bf16")
endif()
if(NOT out MATCHES "windows of 128 tokens" OR NOT out MATCHES "LoRA r=4")
  message(FATAL_ERROR "the banner does not show packing and the adapter")
endif()

# QLoRA: the same run on a 4-bit NF4 base with double quantization (TRL's flags); the banner
# names the 4-bit base, and the adapter and merged folders are written as for LoRA (the merged
# one a float model: the dequantized base plus the update).
set(OUT "${base}/qlora")
run_example(llama_sft ${flags} --load_in_4bit --use_bnb_nested_quant)
check_global_step("${OUT}" 6)
check_files("${OUT}" adapter_config.json adapter_model.safetensors checkpoint-3/adapter_model.safetensors
            merged/config.json merged/model.safetensors)
if(NOT out MATCHES "a nf4 base of 14 layers in [0-9.]+ MB \\(0\\.5[0-9]* bytes a value\\)")
  message(FATAL_ERROR "the QLoRA banner does not show the 4-bit base:\n${out}")
endif()

set(OUT "${base}/resumed")
run_example(llama_sft ${flags} --resume_from_checkpoint "${base}/straight/checkpoint-3")
hf_check(resumed --straight "${base}/straight" --resumed "${base}/resumed" --from_step 3)

set(OUT "${base}/eval_fp32")
run_example(llama_sft --data_dir "${DATA}" --model_name_or_path "${base}/straight/base" --lora_adapter "${base}/straight"
            --do_eval --bf16 false --packing 0 --max_length 1024 --per_device_eval_batch_size 1)
hf_check(peft --output "${base}/straight" --data "${DATA}" --results "${OUT}/eval_results.json")

# Generation in evaluation: the merged model's greedy completions of the held-out prompts,
# scored by exact match, equal to transformers' generate on each prompt.
set(OUT "${base}/generate")
run_example(llama_sft --data_dir "${DATA}" --model_name_or_path "${base}/straight/merged" --use_peft false --do_eval
            --bf16 false --predict_with_generate --per_device_eval_batch_size 1)
hf_check(generate --model "${base}/straight/merged" --data "${DATA}" --results "${OUT}/eval_results.json"
         --generations "${OUT}/eval_generations.jsonl")

# --prompt alone only generates: the merged folder's greedy completion of a KJV prompt (a
# newline appended, as kjv.py's prompts end), as transformers' generate.
set(OUT "${base}/prompt")
run_example(llama_sft --data_dir "${DATA}" --model_name_or_path "${base}/straight/merged" --use_peft false
            --prompt "Genesis 1:3" --max_new_tokens 12)
save_output("${base}/prompt.log")
hf_check(complete --model "${base}/straight/merged" --prompt "Genesis 1:3" --max_new_tokens 12 --log "${base}/prompt.log")

# --predict_file: every prompt of a JSON Lines file (a blank line among them), in left-padded
# batches of 3, into predictions.jsonl; each line is transformers' greedy completion of its
# prompt generated alone. A malformed line is refused by FILE:LINE before anything runs.
file(WRITE "${base}/prompts.jsonl" "{\"prompt\": \"Genesis 1:3\"}\n{\"prompt\": \"Exodus 20:13\"}\n\n"
     "{\"prompt\": \"John 3:16\"}\n{\"prompt\": \"In the beginning God created the heaven and the earth.\"}\n"
     "{\"prompt\": \"Psalms 23:1\"}\n")
set(OUT "${base}/predict")
run_example(llama_sft --data_dir "${DATA}" --model_name_or_path "${base}/straight/merged" --use_peft false
            --predict_file "${base}/prompts.jsonl" --max_new_tokens 12 --per_device_eval_batch_size 3)
hf_check(predictions --model "${base}/straight/merged" --prompts "${base}/prompts.jsonl"
         --predictions "${OUT}/predictions.jsonl" --max_new_tokens 12)
file(WRITE "${base}/bad_prompts.jsonl" "{\"prompt\": \"Genesis 1:3\"}\n{\"text\": \"no prompt\"}\n")
set(OUT "${base}")
expect_loom_error(".*bad_prompts.jsonl:2: each line must be an object with a string \"prompt\"" --data_dir "${DATA}"
                  --do_train --predict_file "${base}/bad_prompts.jsonl")

# Nothing lost: a start that is refused, or that would not resume the checkpoints there,
# leaves the output folder as it was (the random base its adapters were trained on included),
# and a resume continues on the base the checkpoint's adapter names or stops.
expect_refusal_keeps("${base}/straight" ".*/straight/base holds the random base an earlier run's adapters were trained on.*"
                     ${flags} --seed 7 --overwrite_output_dir)
file(RENAME "${base}/straight/base" "${base}/straight_base_moved")
expect_refusal_keeps("${base}/straight" "the adapter in .*checkpoint-6 was trained on the base in .*/straight/base, which is missing.*"
                     ${flags} --resume_from_checkpoint latest)
file(RENAME "${base}/straight_base_moved" "${base}/straight/base")
expect_refusal_keeps("${base}/straight" "--model_name_or_path .*/merged is not the base the adapter in .*checkpoint-6 was trained on.*"
                     ${flags} --resume_from_checkpoint latest --model_name_or_path "${base}/straight/merged")

set(OUT "${base}")
# Refused before anything is written: a sampling flag (checked before training, not after it),
# and a flag the Trainer refuses once the random base is drawn (it is staged, then removed).
expect_loom_error("generate: top_p must be in \\[0, 1\\], got 2" --data_dir "${DATA}" --do_train --prompt "Genesis 1:1"
                  --do_sample --top_p 2)
expect_loom_error("--fsdp_transformer_layer_cls_to_wrap / --fsdp_min_num_params choose --sharding full_shard's units.*"
                  ${flags} --fsdp_min_num_params 5)
expect_loom_error("--generation_num_beams 4: beam search is not implemented; generation is greedy \\(1 beam\\)"
                  --data_dir "${DATA}" --predict_with_generate --generation_num_beams 4)
expect_loom_error("--load_in_4bit: a 4-bit base is frozen, so training it needs an adapter \\(QLoRA\\).*"
                  --data_dir "${DATA}" --use_peft false --load_in_4bit)
expect_loom_error("--packing must be 0 \\(padded rows\\) or a window size, got -1" --data_dir "${DATA}" --packing -1)
expect_loom_error("--packing 1000000000 is longer than 1048576 tokens, the longest sequence loom builds a model for"
                  --data_dir "${DATA}" --packing 1000000000)
expect_loom_error("--lora_config and --lora_adapter both give the LoRA config.*" --data_dir "${DATA}"
                  --lora_config x.json --lora_adapter y)
# A tokenizer.json whose ids run past the model's vocabulary, where --prompt will encode with it:
# refused at start-up, before the training, not by an index error in the first forward after it.
file(COPY "${DATA}/" DESTINATION "${base}/wide_tokenizer")
file(READ "${DATA}/tokenizer.json" tokenizer)
string(JSON tokenizer SET "${tokenizer}" model vocab zzzq 100000)
file(WRITE "${base}/wide_tokenizer/tokenizer.json" "${tokenizer}")
expect_loom_error(".*/wide_tokenizer/tokenizer.json: this tokenizer gives ids up to 100000, past the model's vocabulary of 512 ids.*"
                  --data_dir "${base}/wide_tokenizer" --do_train --prompt "Genesis 1:1" --hidden_size 32
                  --intermediate_size 64 --num_hidden_layers 2 --num_attention_heads 4 --num_key_value_heads 2)
message("llama_sft smoke ok")
