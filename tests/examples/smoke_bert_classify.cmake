# The bert_classify example on the fixture's tiny KJV folder (DATA): 10 steps of a 1-layer
# model, one process, fp32, then the same under torchrun (2 processes) with each sharding
# policy (FullShard's units: the encoder layers), which must all give the same losses and
# accuracy. Each reports eval_accuracy against the majority baseline; transformers opens the
# saved HF folders (one process, FullShard) and gets loom's held-out loss and accuracy, and the
# labels --predict prints for a sentence (truncated to 8 ids). Bad example flags end at
# start-up with one `loom:` line.
include("${CMAKE_CURRENT_LIST_DIR}/example_outputs.cmake")
set(base "${OUT}")
set(flags --data_dir "${DATA}" --max_steps 10 --logging_steps 5 --eval_strategy steps --eval_steps 5 --num_hidden_layers 1
          --hidden_size 32 --num_attention_heads 2 --intermediate_size 64 --max_seq_length 32)

set(OUT "${base}/single")
run_example(bert_classify ${flags})
check_outputs(10 eval_accuracy eval_majority_accuracy eval_loss train_loss)
check_files("${OUT}" config.json tokenizer.json)
if(NOT out MATCHES "eval_accuracy [0-9.]+ against the majority baseline 0\\.2550")
  message(FATAL_ERROR "bert_classify did not report eval_accuracy against the majority baseline (0.2550 here)")
endif()
hf_check(transformers --model "${OUT}" --data "${DATA}" --results "${OUT}/eval_results.json" --max_seq_length 32)

# --predict alone only predicts: the saved folder's labels for a sentence, as transformers gives them.
set(OUT "${base}/predict")
set(sentence "And Jesus answered and said unto them, Verily I say unto you")
run_example(bert_classify --data_dir "${DATA}" --model_name_or_path "${base}/single" --max_seq_length 8
            --predict "${sentence}")
save_output("${base}/predict.log")
hf_check(classify --model "${base}/single" --data "${DATA}" --sentence "${sentence}" --max_seq_length 8
         --log "${base}/predict.log")

set(dirs)
foreach(policy ddp zero1 zero2 full_shard)
  set(OUT "${base}/${policy}")
  run_torchrun("bert_classify --sharding ${policy}" "bert_classify: [0-9]+ training" ${flags} --sharding ${policy})
  check_outputs(10 eval_accuracy eval_majority_accuracy)
  list(APPEND dirs "${OUT}")
endforeach()
hf_check(same --keys train_loss eval_loss eval_accuracy -- ${dirs})
hf_check(transformers --model "${OUT}" --data "${DATA}" --results "${OUT}/eval_results.json" --max_seq_length 32)

set(OUT "${base}")
expect_loom_error("--hidden_size must be a positive multiple of --num_attention_heads 4, got 30"
                  --data_dir "${DATA}" --hidden_size 30)
expect_loom_error("--max_seq_length 512 exceeds --model_name_or_path [^ ]*'s max_position_embeddings 32"
                  --data_dir "${DATA}" --model_name_or_path "${base}/single" --max_seq_length 512)
# An HF folder whose problem_type is not the data's (the KJV token files hold class ids).
foreach(problem regression multi_label_classification)
  file(REMOVE_RECURSE "${base}/${problem}")
  file(COPY "${base}/single/" DESTINATION "${base}/${problem}")
  file(READ "${base}/${problem}/config.json" config)
  string(JSON config SET "${config}" problem_type "\"${problem}\"")
  file(WRITE "${base}/${problem}/config.json" "${config}")
  set(says "but the labels of [^ ]* are single_label_classification \\(meta.json's classification.problem_type\\)")
  expect_loom_error("--model_name_or_path [^ ]*/${problem} has problem_type ${problem}, ${says}"
                    --data_dir "${DATA}" --model_name_or_path "${base}/${problem}")
endforeach()
# A label outside [0, num_labels) stops the run when the data is read (libtorch aborted on a
# negative one, and a large one gave a bare libtorch message).
foreach(case "val;3;-1" "train;5;7")
  list(GET case 0 split)
  list(GET case 1 index)
  list(GET case 2 value)
  hf_check(set_label --data "${DATA}" --out "${base}/bad_labels" --split ${split} --example ${index} --value ${value})
  expect_loom_error("[^ ]*/bad_labels/[^ ]*: example ${index} has label ${value}, outside \\[0, 7\\) \\(the model's num_labels\\)"
                    --data_dir "${base}/bad_labels" --hidden_size 32 --num_attention_heads 2)
endforeach()
message("bert_classify smoke ok")
