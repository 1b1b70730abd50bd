# The example's command line as HF's `python train.py args.json` has it: a JSON file of
# settings first (keys of TrainingArguments and of the example's own struct alike), flags
# after it overriding the file; then --help, listing each struct under its heading with the
# descriptions.
include("${CMAKE_CURRENT_LIST_DIR}/example_outputs.cmake")

set(settings "${OUT}_settings.json")
file(WRITE "${settings}" [=[{
  "max_steps": 50,
  "logging_steps": 2,
  "eval_strategy": "no",
  "max_train_samples": 256,
  "max_eval_samples": 64
}
]=])
run_example(fashion_mnist "${settings}" --max_steps 4)
check_outputs(4 eval_loss train_loss)  # 4 steps: the flag overrides the file's 50
if(NOT out MATCHES "fashion_mnist: 256 training and 64 test images")
  message(FATAL_ERROR "the example's own settings were not read from ${settings}")
endif()

execute_process(COMMAND "${EXE}" --help RESULT_VARIABLE rc OUTPUT_VARIABLE help ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "--help exited with ${rc}: ${err}")
endif()
string(FIND "${help}" "\nexample:\n  --data_dir <string>  (default: /usr/share/datasets/fashion-mnist)\n      folder with the four IDX .gz files\n" example_at)
string(FIND "${help}" "\nTrainingArguments:\n  --output_dir <string>  (default: output/fashion_mnist)\n      where checkpoints and results go\n" training_at)
string(FIND "${help}" "\n  --learning_rate <float>  (default: 0.001)\n      peak learning rate\n" lr_at)
if(example_at EQUAL -1 OR training_at EQUAL -1 OR lr_at EQUAL -1 OR NOT example_at LESS training_at)
  message(FATAL_ERROR "--help lacks the headings or descriptions expected:\n${help}")
endif()
message("settings ok")
