# bert_classify on each of HF's problem types, end to end: tests/data/labels_peer.py writes
# small labelled JSON Lines, examples/text_data/prepare.py --classify turns them into token
# folders, and bert_classify trains 12 steps of a 1-layer model on each and reports the
# problem type's metrics beside its text-blind baseline.
include("${CMAKE_CURRENT_LIST_DIR}/example_outputs.cmake")
set(base "${OUT}")
file(REMOVE_RECURSE "${base}")
execute_process(COMMAND "${PYTHON}" "${SOURCE}/tests/data/labels_peer.py" jsonl "${base}/jsonl" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "labels_peer.py jsonl failed")
endif()
set(flags --max_steps 12 --logging_steps 6 --eval_strategy steps --eval_steps 6 --num_hidden_layers 1
          --hidden_size 32 --num_attention_heads 2 --intermediate_size 64 --max_seq_length 24
          --per_device_train_batch_size 8)
foreach(task "single;-;eval_accuracy eval_f1_macro eval_majority_accuracy;eval_accuracy [0-9.]+ against the majority baseline"
             "multi;-;eval_exact_match eval_f1_micro eval_f1_macro eval_majority_exact_match;eval_exact_match [0-9.]+ against the baseline eval_majority_exact_match"
             "regression;-;eval_mse eval_rmse eval_mae eval_pearson eval_mean_baseline_mse;eval_mse [0-9.]+ against the baseline eval_mean_baseline_mse"
             "targets;--label_type regression;eval_mse eval_rmse eval_mae eval_mean_baseline_mse;eval_mse [0-9.]+ against")
  list(GET task 0 name)
  list(GET task 1 label_type)
  list(GET task 2 keys)
  list(GET task 3 says)
  if(label_type STREQUAL "-")
    set(label_type)
  endif()
  separate_arguments(label_type)
  separate_arguments(keys)
  execute_process(COMMAND "${PYTHON}" "${SOURCE}/examples/text_data/prepare.py" --classify "${base}/jsonl/${name}.jsonl"
                          ${label_type} --out "${base}/data_${name}" --vocab_size 300 --val_fraction 0.25
                  RESULT_VARIABLE rc OUTPUT_VARIABLE prep ERROR_VARIABLE prep_err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "prepare.py --classify ${name}: ${prep}${prep_err}")
  endif()
  set(OUT "${base}/${name}")
  run_example(bert_classify --data_dir "${base}/data_${name}" ${flags})
  check_outputs(12 eval_loss train_loss ${keys})
  if(NOT out MATCHES "${says}")
    message(FATAL_ERROR "bert_classify on ${name} did not report '${says}':\n${out}")
  endif()
endforeach()
message("bert_classify problem types ok")
