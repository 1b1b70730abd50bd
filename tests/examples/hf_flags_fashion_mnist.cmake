# HF's command-line flags on the example (issue 11): --do_train / --do_eval / --do_predict
# choose what runs, --evaluation_strategy is --eval_strategy, an output folder with
# checkpoints resumes from the last one unless --overwrite_output_dir, a non-empty one
# without checkpoints stops with a loom: line, --local_rank is accepted.
include("${CMAKE_CURRENT_LIST_DIR}/example_outputs.cmake")

function(run_in dir expect_rc)
  execute_process(COMMAND "${EXE}" ${ARGN} --output_dir "${dir}" --disable_tqdm --max_train_samples 640
                          --max_eval_samples 256
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc EQUAL expect_rc)
    message(FATAL_ERROR "exited with ${rc}, expected ${expect_rc}")
  endif()
  set(out "${out}" PARENT_SCOPE)
  set(err "${err}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${OUT}")
set(train --do_train --max_steps 10 --save_strategy steps --save_steps 5 --evaluation_strategy steps --eval_steps 5
          --logging_steps 5)
# 1. Training only (evaluation during training implies do_eval, as HF's __post_init__).
run_in("${OUT}/run" 0 ${train})
check_global_step("${OUT}/run" 10)
foreach(f checkpoint-5 checkpoint-10 eval_results.json)
  if(NOT EXISTS "${OUT}/run/${f}")
    message(FATAL_ERROR "missing ${f}")
  endif()
endforeach()
if(EXISTS "${OUT}/run/predict_results.txt")
  message(FATAL_ERROR "predicted without --do_predict")
endif()
file(READ "${OUT}/run/trainer_state.json" state)
if(NOT state MATCHES "\"eval_loss\"")
  message(FATAL_ERROR "--evaluation_strategy steps did not evaluate during training")
endif()

# 2. The same folder again, longer: the last checkpoint is picked up.
set(longer ${train})
list(TRANSFORM longer REPLACE "^10$" "15")
run_in("${OUT}/run" 0 ${longer})
if(NOT out MATCHES "checkpoint detected, resuming training at [^\n]*checkpoint-10")
  message(FATAL_ERROR "the last checkpoint was not resumed")
endif()
check_global_step("${OUT}/run" 15)

# 3. --overwrite_output_dir: from scratch.
run_in("${OUT}/run" 0 --do_train --max_steps 5 --save_strategy no --eval_strategy no --overwrite_output_dir)
if(out MATCHES "resuming")
  message(FATAL_ERROR "--overwrite_output_dir resumed")
endif()
check_global_step("${OUT}/run" 5)

# 4. Evaluation and prediction only (torch.distributed.launch's --local_rank accepted).
file(REMOVE "${OUT}/run/eval_results.json")
run_in("${OUT}/run" 0 --do_eval --do_predict --local_rank 0)
check_global_step("${OUT}/run" 5)  # not trained again
foreach(f eval_results.json predict_results.json predict_results.txt)
  if(NOT EXISTS "${OUT}/run/${f}")
    message(FATAL_ERROR "missing ${f}")
  endif()
endforeach()
file(STRINGS "${OUT}/run/predict_results.txt" lines)
list(LENGTH lines n)
if(NOT n EQUAL 257)
  message(FATAL_ERROR "predict_results.txt has ${n} lines, expected 257")
endif()

# 5. A non-empty folder without checkpoints.
file(WRITE "${OUT}/other/notes.txt" "not a run")
run_in("${OUT}/other" 2 --do_train --max_steps 5)
if(NOT err MATCHES "loom: output directory [^\n]*other already exists and is not empty; use --overwrite_output_dir")
  message(FATAL_ERROR "no loom: line for a non-empty output folder")
endif()
message("hf flags ok")
