# Smoke run of the char_lm example: a tiny model for a few steps on a slice of the KJV text,
# then a check that the results hold eval_loss and eval_perplexity and that a sample was printed.
include("${CMAKE_CURRENT_LIST_DIR}/example_outputs.cmake")
run_example(char_lm --max_steps 6 --warmup_steps 1 --logging_steps 3 --eval_steps 3
            --n_layer 1 --n_head 2 --n_embd 32 --block_size 32
            --max_train_blocks 256 --max_eval_blocks 16
            --sample_length 40 --sample_prompt "And God said")
check_outputs(6 eval_loss eval_perplexity train_loss train_runtime train_samples_per_second)
# The sample: the prompt followed by 40 generated characters, after the sample header.
if(NOT out MATCHES "\\*\\*\\*\\*\\* sample [^\n]*\nAnd God said")
  message(FATAL_ERROR "char_lm printed no sample")
endif()
message("example smoke ok")
