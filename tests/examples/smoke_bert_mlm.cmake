# The bert_mlm example (masked-LM pretraining, HF's run_mlm.py) on the fixture's tiny KJV
# folder (DATA): 6 steps of a 1-layer model with evaluations and checkpoints at 3 and 6; the
# same run resumed from checkpoint-3 logs the same losses after step 3 (each batch's mask is
# keyed on its place in the run, so the resumed run masks what the straight one masked) and
# ends with the same results; transformers opens the saved folder as BertForMaskedLM and its
# fill-mask pipeline fills a masked verse. Bad masking flags end at start-up with one `loom:` line.
include("${CMAKE_CURRENT_LIST_DIR}/example_outputs.cmake")
set(base "${OUT}")
set(flags --data_dir "${DATA}" --max_steps 6 --warmup_steps 1 --logging_steps 1 --eval_strategy steps --eval_steps 3
          --save_strategy steps --save_steps 3 --num_hidden_layers 1 --hidden_size 32 --num_attention_heads 2
          --intermediate_size 64 --max_seq_length 32 --per_device_train_batch_size 8)

set(OUT "${base}/straight")
run_example(bert_mlm ${flags})
check_outputs(6 eval_loss eval_accuracy perplexity train_loss)
check_files("${OUT}" config.json tokenizer.json checkpoint-3/model.safetensors checkpoint-3/optimizer.safetensors)
if(NOT out MATCHES "bert_mlm: perplexity [0-9.]+ on the held-out verses")
  message(FATAL_ERROR "bert_mlm did not report its perplexity")
endif()

set(OUT "${base}/resumed")
run_example(bert_mlm ${flags} --resume_from_checkpoint "${base}/straight/checkpoint-3")
hf_check(resumed --straight "${base}/straight" --resumed "${base}/resumed" --from_step 3)

execute_process(COMMAND "${PYTHON}" "${CMAKE_CURRENT_LIST_DIR}/mlm_check.py" "${base}/straight" "${DATA}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE py_out ERROR_VARIABLE py_err)
message("${py_out}${py_err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "mlm_check.py failed (${rc})")
endif()

set(OUT "${base}")
expect_loom_error("masked-LM option mlm_probability must lie in \\[0, 1\\], got 1.5"
                  --data_dir "${DATA}" --mlm_probability 1.5)
expect_loom_error("masked-LM options mask_replace_prob \\(0.9\\) and random_replace_prob \\(0.2\\) add up to more than 1"
                  --data_dir "${DATA}" --mask_replace_prob 0.9 --random_replace_prob 0.2)
message("bert_mlm smoke ok")
