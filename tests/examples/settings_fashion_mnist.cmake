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
string(FIND "${help}" "\nTrainingArguments:\n output:\n  --output_dir <string>  (default: output/fashion_mnist)\n      where checkpoints and results go\n" training_at)
string(FIND "${help}" "\n  --learning_rate <float>  (default: 0.001)\n      peak learning rate\n" lr_at)
if(example_at EQUAL -1 OR training_at EQUAL -1 OR lr_at EQUAL -1 OR NOT example_at LESS training_at)
  message(FATAL_ERROR "--help lacks the headings or descriptions expected:\n${help}")
endif()
# A settings file written by transformers itself (TrainingArguments.to_json_string: all of its
# 114 fields, in HF's own forms) trains as it says; its settings loom has no flag for, at HF's
# defaults, are listed once at info level. A non-default one is refused by name.
if(PYTHON AND EXISTS "${PYTHON}")
  set(hf "${OUT}_hf.json")
  execute_process(COMMAND "${PYTHON}" -c [=[
import sys
from transformers import TrainingArguments
args = TrainingArguments(output_dir="unused", do_train=True, do_eval=True, max_steps=3, logging_steps=1,
                         learning_rate=2e-3, lr_scheduler_type="cosine", lr_scheduler_kwargs={"num_cycles": 0.25},
                         per_device_train_batch_size=16, seed=7, save_strategy="no", eval_strategy="no",
                         include_for_metrics=["loss"], report_to=[], disable_tqdm=True)
open(sys.argv[1], "w").write(args.to_json_string())
]=] "${hf}" RESULT_VARIABLE rc ERROR_VARIABLE py_err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "transformers could not write ${hf}: ${py_err}")
  endif()
  run_example(fashion_mnist "${hf}" --log_level info --max_train_samples 256 --max_eval_samples 64)
  check_outputs(3 eval_loss train_loss)
  file(READ "${OUT}/training_args.json" written)
  string(JSON lr GET "${written}" learning_rate)
  string(JSON kwargs GET "${written}" lr_scheduler_kwargs)
  string(JSON batch GET "${written}" per_device_train_batch_size)
  string(JSON seed GET "${written}" seed)
  if(NOT lr EQUAL 0.002 OR NOT batch EQUAL 16 OR NOT seed EQUAL 7 OR NOT kwargs MATCHES "num_cycles\":0.25")
    message(FATAL_ERROR "HF's settings file was not read as it says: ${written}")
  endif()
  if(NOT err MATCHES "transformers settings read at values loom already honours, with no flag of loom's: [^\n]*accelerator_config, [^\n]*hub_token")
    message(FATAL_ERROR "the foreign settings at HF's defaults were not listed")
  endif()
  file(READ "${hf}" text)
  string(REPLACE "\"torch_compile\": false" "\"torch_compile\": true" text "${text}")
  file(WRITE "${hf}" "${text}")
  execute_process(COMMAND "${EXE}" "${hf}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "^loom: [^\n]*: JSON key 'torch_compile' is a transformers.TrainingArguments field that loom does not take: [^\n]*given true")
    message(FATAL_ERROR "torch_compile true was not refused by name (exit ${rc}): ${err}")
  endif()
endif()
message("settings ok")
