# The gpt2 example, one process, bf16 (its default), on the fixture's tiny KJV folder (DATA):
# 6 steps with evaluations and checkpoints at 3 and 6; the same run resumed from checkpoint-3
# logs the same losses after step 3 and ends with the same results; the saved HF folder,
# read back by loom (--model_name_or_path, --do_eval, fp32) and by transformers, gives the same
# held-out loss on both sides; --prompt on that folder prints the completion transformers'
# greedy generate gives. Bad example flags end at start-up with one `loom:` line.
include("${CMAKE_CURRENT_LIST_DIR}/example_outputs.cmake")
set(base "${OUT}")
set(flags --data_dir "${DATA}" --max_steps 6 --warmup_steps 1 --logging_steps 1 --eval_steps 3 --save_steps 3
          --n_layer 1 --n_head 2 --n_embd 32 --block_size 32)

set(OUT "${base}/straight")
run_example(gpt2 ${flags})
check_outputs(6 eval_loss eval_perplexity train_loss train_runtime)
check_files("${OUT}" config.json tokenizer.json checkpoint-3/model.safetensors checkpoint-3/optimizer.safetensors
            checkpoint-6/trainer_state.json)
file(READ "${OUT}/training_args.json" training_args)
string(JSON bf16 GET "${training_args}" bf16)
if(NOT bf16)
  message(FATAL_ERROR "the default run did not train in bf16")
endif()

set(OUT "${base}/resumed")
run_example(gpt2 ${flags} --resume_from_checkpoint "${base}/straight/checkpoint-3")
hf_check(resumed --straight "${base}/straight" --resumed "${base}/resumed" --from_step 3)

set(OUT "${base}/eval_fp32")
run_example(gpt2 --data_dir "${DATA}" --block_size 32 --model_name_or_path "${base}/straight" --do_eval --bf16 false)
hf_check(transformers --model "${base}/straight" --data "${DATA}" --results "${OUT}/eval_results.json" --block_size 32)

# --prompt alone only generates: the saved folder's greedy completion, as transformers' generate.
set(OUT "${base}/prompt")
run_example(gpt2 --data_dir "${DATA}" --model_name_or_path "${base}/straight" --prompt "And God said" --max_new_tokens 12)
save_output("${base}/prompt.log")
hf_check(complete --model "${base}/straight" --prompt "And God said" --max_new_tokens 12 --log "${base}/prompt.log")

set(OUT "${base}")
expect_loom_error("--data_dir [^ ]*: no meta.json there; prepare the KJV token files with `make kjv-data`.*"
                  --data_dir "${base}/nothing")
expect_loom_error("--n_embd must be a positive multiple of --n_head 4, got 30" --data_dir "${DATA}" --n_embd 30)
expect_loom_error("--block_size 64 exceeds --model_name_or_path [^ ]*'s n_positions 32"
                  --data_dir "${DATA}" --model_name_or_path "${base}/straight" --block_size 64)
expect_loom_error("--prompt and --predict_file are not supported under --sharding full_shard .*" ${flags}
                  --do_train --sharding full_shard --prompt "And God said")
expect_loom_error("--max_new_tokens must be positive, got 0" --data_dir "${DATA}" --prompt "x" --max_new_tokens 0)
message("gpt2 smoke ok")
