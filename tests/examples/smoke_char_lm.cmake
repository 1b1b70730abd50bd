# Smoke run of the char_lm example: a tiny model for a few steps on a slice of the KJV text,
# then a check that the results hold eval_loss and eval_perplexity and that a sample was printed.
file(REMOVE_RECURSE "${OUT}")
execute_process(COMMAND "${EXE}" --max_steps 6 --warmup_steps 1 --logging_steps 3 --eval_steps 3
                        --n_layer 1 --n_head 2 --n_embd 32 --block_size 32
                        --max_train_blocks 256 --max_eval_blocks 16
                        --sample_length 40 --sample_prompt "And God said"
                        --output_dir "${OUT}" --disable_tqdm
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "char_lm exited with ${rc}")
endif()
foreach(f trainer_state.json all_results.json train_results.json eval_results.json)
  if(NOT EXISTS "${OUT}/${f}")
    message(FATAL_ERROR "missing ${OUT}/${f}")
  endif()
endforeach()
file(READ "${OUT}/all_results.json" all)
foreach(key eval_loss eval_perplexity train_loss train_runtime train_samples_per_second)
  string(JSON value ERROR_VARIABLE e GET "${all}" ${key})
  if(e)
    message(FATAL_ERROR "all_results.json has no ${key}")
  endif()
endforeach()
file(READ "${OUT}/trainer_state.json" state)
string(JSON steps GET "${state}" global_step)
if(NOT steps EQUAL 6)
  message(FATAL_ERROR "trainer_state.json global_step is ${steps}, expected 6")
endif()
# The sample: the prompt followed by 40 generated characters, after the sample header.
if(NOT out MATCHES "\\*\\*\\*\\*\\* sample [^\n]*\nAnd God said")
  message(FATAL_ERROR "char_lm printed no sample")
endif()
message("example smoke ok")
