# Bad input to the real fashion_mnist binary must end at start-up with one clear `loom:` line.
#
#   cmake -DEXE=<path to fashion_mnist> -DOUT=<scratch folder> -P bad_input.cmake
#
# Each case runs in a fresh folder OUT/<NN>_<name>/ whose run/ subfolder (the --output_dir)
# already holds an earlier run: a real 2-step run of the example with its checkpoint-2/
# (made once, at the top). Every case checks:
#   - the exit code is 2 (not 0, not 1, not a signal, not a timeout);
#   - the last non-empty line of stderr starts with "loom: " and matches the case's regex,
#     stderr holds exactly one "loom:" line and no libtorch stack trace;
#   - the run took less than 20 s (the error came at start-up, before any training);
#   - every file that was in the case folder before is still there, byte for byte, and no
#     file was added (a run that fails at start-up writes nothing).
# Passing cases delete their folder; failing ones are kept for inspection. All failures are
# collected and reported together at the end.

cmake_minimum_required(VERSION 3.23)  # string(TIMESTAMP ... "%f")

if(NOT EXE OR NOT OUT)
  message(FATAL_ERROR "usage: cmake -DEXE=<fashion_mnist> -DOUT=<scratch folder> -P bad_input.cmake")
endif()

set(LIMIT_S 20)       # a start-up error must come within this
set(TIMEOUT_S 40)     # kill a run that trains by mistake (the default run takes minutes)

file(REMOVE_RECURSE "${OUT}")
file(MAKE_DIRECTORY "${OUT}")

# ---- the earlier run every case starts from --------------------------------------------
set(SEED "${OUT}/seed")
execute_process(COMMAND "${EXE}" --max_steps 2 --save_strategy steps --save_steps 2 --max_train_samples 256
                        --max_eval_samples 64 --disable_tqdm --output_dir "${SEED}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
if(NOT rc EQUAL 0 OR NOT EXISTS "${SEED}/checkpoint-2/model.safetensors")
  message(FATAL_ERROR "could not make the earlier run the cases start from (exit ${rc}):\n${out}${err}")
endif()

# ---- helpers ----------------------------------------------------------------------------

# Sets <var> to "relpath=sha256" entries (a list) of every file and "relpath/" of every folder
# under <dir>, hidden ones included.
function(snapshot dir var)
  file(GLOB_RECURSE entries LIST_DIRECTORIES true RELATIVE "${dir}" "${dir}/*")
  list(SORT entries)
  set(result)
  foreach(e IN LISTS entries)
    if(IS_DIRECTORY "${dir}/${e}")
      list(APPEND result "${e}/")
    else()
      file(SHA256 "${dir}/${e}" h)
      list(APPEND result "${e}=${h}")
    endif()
  endforeach()
  set(${var} "${result}" PARENT_SCOPE)
endfunction()

set(FAILURES "")
set(PASSED 0)
set(CASE_NO 0)

# bad_case(<name> EXPECT <regex> [SETUP <kind>] [NO_OUTPUT_DIR] ARGS <flag>...)
#   SETUP earlier_run (default): run/ holds a copy of the seed run (files and checkpoint-2/).
#   SETUP empty: run/ exists and is empty.
#   SETUP none: no run/ folder.
#   SETUP truncated_bare: earlier run plus run/checkpoint-3/ holding only an empty
#         model.safetensors and a trainer_state.json.
#   SETUP truncated_empty_model: earlier run plus run/checkpoint-3/, a full copy of
#         checkpoint-2 whose model.safetensors is empty (0 bytes).
#   SETUP truncated_half_model: as truncated_empty_model, model.safetensors cut in half.
#   SETUP bad_state: earlier run plus run/checkpoint-3/, a full copy whose
#         trainer_state.json is not JSON.
#   SETUP bad_scheduler: earlier run plus a full copy run/checkpoint-3/ whose scheduler.json
#         is not JSON.
#   SETUP wrong_weights: earlier run plus a full copy run/checkpoint-3/ whose model.safetensors
#         holds other tensors (the optimizer's moments).
#   SETUP incomplete_only: run/ holds only checkpoint-4/ without trainer_state.json.
#   The string RUN in ARGS is replaced by the case's output folder.
#   NO_OUTPUT_DIR: do not prepend --output_dir RUN (the case sets it itself).
function(bad_case name)
  cmake_parse_arguments(PARSE_ARGV 1 C "NO_OUTPUT_DIR" "EXPECT;SETUP" "ARGS")
  math(EXPR n "${CASE_NO} + 1")
  set(CASE_NO ${n} PARENT_SCOPE)
  if(n LESS 10)
    set(n "0${n}")
  endif()
  set(dir "${OUT}/${n}_${name}")
  set(run "${dir}/run")
  file(MAKE_DIRECTORY "${dir}")
  if(NOT C_SETUP)
    set(C_SETUP earlier_run)
  endif()

  # -- the folder as an earlier run left it
  if(C_SETUP STREQUAL "empty")
    file(MAKE_DIRECTORY "${run}")
  elseif(C_SETUP STREQUAL "incomplete_only")
    file(MAKE_DIRECTORY "${run}/checkpoint-4")
    file(COPY "${SEED}/checkpoint-2/model.safetensors" DESTINATION "${run}/checkpoint-4")
  elseif(NOT C_SETUP STREQUAL "none")
    file(COPY "${SEED}/" DESTINATION "${run}")
    file(WRITE "${run}/notes.txt" "an earlier run's file that must survive\n")
    set(ck3 "${run}/checkpoint-3")
    if(C_SETUP STREQUAL "truncated_bare")
      file(MAKE_DIRECTORY "${ck3}")
      file(TOUCH "${ck3}/model.safetensors")
      file(COPY "${SEED}/checkpoint-2/trainer_state.json" DESTINATION "${ck3}")
    elseif(C_SETUP MATCHES "^truncated_(empty|half)_model$|^bad_state$|^bad_scheduler$|^wrong_weights$")
      file(COPY "${SEED}/checkpoint-2/" DESTINATION "${ck3}")
      if(C_SETUP STREQUAL "truncated_empty_model")
        file(WRITE "${ck3}/model.safetensors" "")
      elseif(C_SETUP STREQUAL "truncated_half_model")
        file(SIZE "${ck3}/model.safetensors" size)
        math(EXPR half "${size} / 2")
        file(REMOVE "${ck3}/model.safetensors")
        execute_process(COMMAND head -c ${half} "${SEED}/checkpoint-2/model.safetensors"
                        OUTPUT_FILE "${ck3}/model.safetensors")
        file(SIZE "${ck3}/model.safetensors" cut)
        if(NOT cut EQUAL half)
          message(FATAL_ERROR "could not cut model.safetensors to ${half} bytes (got ${cut})")
        endif()
      elseif(C_SETUP STREQUAL "bad_state")
        file(WRITE "${ck3}/trainer_state.json" "{\"global_step\": 3, \"log_history\": [")
      elseif(C_SETUP STREQUAL "bad_scheduler")
        file(WRITE "${ck3}/scheduler.json" "{\"last_epoch\": ")
      elseif(C_SETUP STREQUAL "wrong_weights")
        file(COPY_FILE "${ck3}/optimizer.safetensors" "${ck3}/model.safetensors")
      endif()
    elseif(NOT C_SETUP STREQUAL "earlier_run")
      message(FATAL_ERROR "bad_case ${name}: unknown SETUP ${C_SETUP}")
    endif()
  endif()

  set(argv)
  if(NOT C_NO_OUTPUT_DIR)
    list(APPEND argv --output_dir "${run}")
  endif()
  foreach(a IN LISTS C_ARGS)
    string(REPLACE "RUN" "${run}" a "${a}")
    list(APPEND argv "${a}")
  endforeach()

  snapshot("${dir}" before)
  string(TIMESTAMP t0 "%s%f" UTC)
  execute_process(COMMAND "${EXE}" ${argv} WORKING_DIRECTORY "${dir}" TIMEOUT ${TIMEOUT_S}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(TIMESTAMP t1 "%s%f" UTC)
  math(EXPR ms "(${t1} - ${t0}) / 1000")
  snapshot("${dir}" after)

  set(problems "")
  if(NOT rc STREQUAL "2")
    string(APPEND problems "\n    exit code is '${rc}', expected 2")
  endif()
  if(ms GREATER_EQUAL ${LIMIT_S}000)
    string(APPEND problems "\n    took ${ms} ms, expected a start-up error within ${LIMIT_S} s")
  endif()
  string(REGEX MATCH "[^\n]+\n*$" last "${err}")
  string(STRIP "${last}" last)
  if(NOT last MATCHES "^loom: ")
    string(APPEND problems "\n    the last stderr line does not start with 'loom: '")
  elseif(NOT last MATCHES "${C_EXPECT}")
    string(APPEND problems "\n    the last stderr line does not match '${C_EXPECT}'")
  endif()
  string(REGEX MATCHALL "(^|\n)loom:" loom_lines "${err}")
  list(LENGTH loom_lines loom_count)
  if(NOT loom_count EQUAL 1)
    string(APPEND problems "\n    stderr holds ${loom_count} lines starting with 'loom:', expected 1")
  endif()
  if(err MATCHES "Exception raised from|frame #[0-9]|terminate called|Aborted|Segmentation")
    string(APPEND problems "\n    stderr holds a crash report or libtorch stack trace")
  endif()
  foreach(entry IN LISTS before)
    if(NOT entry IN_LIST after)
      string(REGEX REPLACE "=[0-9a-f]+$" "" path "${entry}")
      string(APPEND problems "\n    earlier content changed or removed: ${path}")
    endif()
  endforeach()
  foreach(entry IN LISTS after)
    if(NOT entry IN_LIST before)
      string(REGEX REPLACE "=[0-9a-f]+$" "" path "${entry}")
      string(APPEND problems "\n    new file after a start-up error: ${path}")
    endif()
  endforeach()

  list(JOIN argv " " shown)
  if(problems)
    set(report "FAIL ${n}_${name}: fashion_mnist ${shown}${problems}\n    stderr:\n${err}")
    message("${report}")
    set(FAILURES "${FAILURES}  ${n}_${name}\n" PARENT_SCOPE)
  else()
    message("ok   ${n}_${name} (${ms} ms): ${last}")
    math(EXPR p "${PASSED} + 1")
    set(PASSED ${p} PARENT_SCOPE)
    file(REMOVE_RECURSE "${dir}")
  endif()
endfunction()

# ---- the cases -----------------------------------------------------------------------------
# Regexes are CMake regexes matched against the last stderr line; keep ';' out of them.

# Precision.
bad_case(fp16_and_bf16 EXPECT "--bf16 and --fp16 cannot both be set; pick one"
         ARGS --fp16 --bf16)

# Best model, save/eval strategies.
bad_case(load_best_steps_vs_epoch
         EXPECT "--load_best_model_at_end requires the save and eval strategy to match .*--eval_strategy steps and --save_strategy epoch$"
         ARGS --load_best_model_at_end --eval_strategy steps --save_strategy epoch)
bad_case(load_best_steps_not_multiple
         EXPECT "--save_steps to be a multiple of --eval_steps, got --save_steps 50 and --eval_steps 30$"
         ARGS --load_best_model_at_end --eval_strategy steps --save_strategy steps --eval_steps 30 --save_steps 50)
bad_case(save_best_without_metric EXPECT "--save_strategy best needs --metric_for_best_model$"
         ARGS --save_strategy best)
bad_case(save_best_without_eval EXPECT "--save_strategy best needs evaluation"
         ARGS --save_strategy best --metric_for_best_model accuracy --eval_strategy no)
# (EarlyStopping's requirements cannot be reached from this example: it has no such callback.)

bad_case(load_best_fraction_and_count
         EXPECT "--load_best_model_at_end requires --save_steps to be a multiple of --eval_steps, which cannot be guaranteed when mixing a fraction and a step count"
         ARGS --load_best_model_at_end --eval_strategy steps --save_strategy steps --eval_steps 0.1 --save_steps 100)

# Batches.
bad_case(train_batch_zero EXPECT "--per_device_train_batch_size must be positive, got 0$"
         ARGS --per_device_train_batch_size 0)
bad_case(train_batch_negative EXPECT "--per_device_train_batch_size must be positive, got -5$"
         ARGS --per_device_train_batch_size -5)
bad_case(eval_batch_zero EXPECT "--per_device_eval_batch_size must be positive, got 0$"
         ARGS --per_device_eval_batch_size 0)
bad_case(grad_accum_zero EXPECT "--gradient_accumulation_steps must be positive, got 0$"
         ARGS --gradient_accumulation_steps 0)
bad_case(train_batch_float EXPECT "--per_device_train_batch_size expects an integer, got '3.5'$"
         ARGS --per_device_train_batch_size 3.5)

# Optimizer.
bad_case(optim_adam EXPECT "--optim must be one of adamw_torch_fused.adamw_torch.adafactor.sgd.adagrad.rmsprop.lion, got 'adam'. did you mean 'adamw_torch'"
         ARGS --optim adam)
bad_case(optim_args_key EXPECT "--optim_args key 'momentom' is not read by --optim sgd. it reads momentum, dampening, nesterov$"
         ARGS --optim sgd --optim_args momentom=0.9)
bad_case(max_grad_norm_negative EXPECT "--max_grad_norm must be >= 0, got -1$"
         ARGS --max_grad_norm -1)
bad_case(adam_beta1_too_big EXPECT "--adam_beta1 must be in \\[0, 1\\), got 1.5$"
         ARGS --adam_beta1 1.5)
bad_case(learning_rate_negative EXPECT "--learning_rate must be >= 0, got -0.001$"
         ARGS --learning_rate -1e-3)

# Length, warmup, schedule.
bad_case(num_train_epochs_zero EXPECT "--num_train_epochs must be positive when --max_steps is not set .* got 0$"
         ARGS --num_train_epochs 0)
bad_case(warmup_ratio_too_big EXPECT "--warmup_ratio must be in \\[0, 1\\], got 1.5$"
         ARGS --warmup_ratio 1.5)
bad_case(warmup_steps_negative EXPECT "--warmup_steps must be >= 0, got -1$"
         ARGS --warmup_steps -1)
bad_case(warmup_ratio_and_steps EXPECT "--warmup_ratio and --warmup_steps cannot both be set"
         ARGS --warmup_ratio 0.1 --warmup_steps 5)
bad_case(scheduler_typo EXPECT "--lr_scheduler_type must be one of .*got 'cosine_with_restart'. did you mean 'cosine_with_restarts'\\?$"
         ARGS --lr_scheduler_type cosine_with_restart)
bad_case(scheduler_kwargs_bad_json EXPECT "--lr_scheduler_kwargs must be a JSON object .*got '{bad json'$"
         ARGS --lr_scheduler_kwargs "{bad json")
# The kwarg names are checked when train() builds the scheduler: after the data and the
# model are ready, still before the first step.
bad_case(scheduler_kwargs_unknown EXPECT "lr_scheduler_kwargs: 'num_cycle' is not an argument of cosine \\(it takes: num_cycles\\)$"
         ARGS --lr_scheduler_type cosine --lr_scheduler_kwargs "{\"num_cycle\": 2}")
bad_case(scheduler_min_lr_missing EXPECT "cosine_with_min_lr needs min_lr or min_lr_rate in lr_scheduler_kwargs"
         ARGS --lr_scheduler_type cosine_with_min_lr)
bad_case(scheduler_wsd_needs_decay EXPECT "warmup_stable_decay needs num_decay_steps in lr_scheduler_kwargs"
         ARGS --lr_scheduler_type warmup_stable_decay)
bad_case(scheduler_kwarg_not_a_number EXPECT "lr_scheduler_kwargs: num_cycles of cosine must be a number, got \"two\"$"
         ARGS --lr_scheduler_type cosine --lr_scheduler_kwargs "{\"num_cycles\": \"two\"}")
bad_case(scheduler_polynomial_lr_end EXPECT "polynomial schedule: lr_end \\(1\\) must be smaller than the learning rate \\(0.001\\)$"
         ARGS --lr_scheduler_type polynomial --lr_scheduler_kwargs "{\"lr_end\": 1}")
bad_case(plateau_without_eval EXPECT "--lr_scheduler_type reduce_lr_on_plateau needs evaluation"
         ARGS --lr_scheduler_type reduce_lr_on_plateau --eval_strategy no)

# Logging, evaluation and saving intervals.
bad_case(eval_strategy_unknown EXPECT "--eval_strategy must be one of no.steps.epoch, got 'sometimes'"
         ARGS --eval_strategy sometimes)
bad_case(eval_steps_no_interval EXPECT "--eval_strategy steps needs a positive --eval_steps \\(or a positive --logging_steps"
         ARGS --eval_strategy steps --logging_strategy no --logging_steps 0)
bad_case(sharding_unknown EXPECT "--sharding must be one of no.ddp.zero1.zero2.full_shard.auto, got 'zero3'. did you mean 'zero1'\\?$"
         ARGS --sharding zero3)
bad_case(logging_steps_zero EXPECT "--logging_steps must be positive, got 0$"
         ARGS --logging_steps 0)
bad_case(eval_steps_zero EXPECT "--eval_steps must be positive, got 0$"
         ARGS --eval_strategy steps --eval_steps 0)
bad_case(save_steps_fractional EXPECT "--save_steps must be a whole number when above 1"
         ARGS --save_strategy steps --save_steps 2.5)
bad_case(save_total_limit_zero EXPECT "--save_total_limit must be positive, got 0$"
         ARGS --save_total_limit 0)
bad_case(seed_negative EXPECT "--seed must be >= 0, got -1$"
         ARGS --seed -1)
bad_case(output_dir_empty EXPECT "--output_dir must not be empty$" NO_OUTPUT_DIR
         ARGS --output_dir=)

# The command line itself.
bad_case(learning_rate_abc EXPECT "--learning_rate expects a number, got 'abc'$"
         ARGS --learning_rate abc)
bad_case(learning_rate_nan EXPECT "--learning_rate expects a number, got 'nan'$"
         ARGS --learning_rate nan)
bad_case(learning_rate_missing_value EXPECT "--learning_rate needs a value \\(a number\\)$"
         ARGS --learning_rate)
bad_case(flag_typo EXPECT "unknown argument --learnng_rate. did you mean --learning_rate\\?$"
         ARGS --learnng_rate 1e-3)
bad_case(flag_unknown EXPECT "unknown argument --banana. see --help$"
         ARGS --banana 1)
bad_case(positional EXPECT "unexpected argument 'train'. flags look like --name value$"
         ARGS train)
bad_case(max_steps_twice EXPECT "--max_steps given twice$"
         ARGS --max_steps 5 --max_steps 6)
bad_case(bool_bad_value EXPECT "--fp16 expects true/false, got 'maybe'$"
         ARGS --fp16 maybe)
# A JSON settings file first (HF's `python train.py args.json`), with a typo in a key.
file(WRITE "${OUT}/typo_settings.json" "{\"max_steps\": 2, \"learnng_rate\": 0.001}\n")
bad_case(settings_file_typo NO_OUTPUT_DIR
         EXPECT "typo_settings.json: unknown JSON key 'learnng_rate'. did you mean 'learning_rate'\\?$"
         ARGS "${OUT}/typo_settings.json" --output_dir RUN)

# Files: data, weights, checkpoints.
bad_case(data_dir_missing EXPECT "dataset file /nonexistent/train-images-idx3-ubyte.gz does not exist$"
         ARGS --data_dir /nonexistent)
bad_case(model_name_or_path_missing
         EXPECT "--model_name_or_path /nonexistent: /nonexistent/model.safetensors does not exist \\(nor model.safetensors.index.json, a sharded model's index\\)$"
         ARGS --model_name_or_path /nonexistent)
bad_case(resume_missing_folder EXPECT "checkpoint folder /nonexistent/checkpoint-5 does not exist$"
         ARGS --resume_from_checkpoint /nonexistent/checkpoint-5)
bad_case(resume_not_a_folder EXPECT ".*/run/notes.txt is a file, not a folder \\(a checkpoint folder\\)$"
         ARGS --resume_from_checkpoint RUN/notes.txt)
bad_case(resume_latest_empty_dir EXPECT "--resume_from_checkpoint latest: no complete checkpoint-N folder in .*/run$"
         SETUP empty ARGS --resume_from_checkpoint latest)
bad_case(resume_latest_no_dir EXPECT "--resume_from_checkpoint latest: no complete checkpoint-N folder in .*/run$"
         SETUP none ARGS --resume_from_checkpoint latest)
bad_case(resume_latest_incomplete_only EXPECT "--resume_from_checkpoint latest: no complete checkpoint-N folder in .*/run$"
         SETUP incomplete_only ARGS --resume_from_checkpoint latest)
# checkpoint-3 with an empty model.safetensors and a trainer_state.json, nothing else: the
# first thing found missing is the optimizer state.
bad_case(resume_truncated_bare EXPECT "checkpoint-3/model.safetensors is not a safetensors file: it has 0 bytes"
         SETUP truncated_bare ARGS --resume_from_checkpoint RUN/checkpoint-3)
bad_case(resume_empty_model EXPECT "checkpoint-3/model.safetensors is not a safetensors file: it has 0 bytes"
         SETUP truncated_empty_model ARGS --resume_from_checkpoint RUN/checkpoint-3)
bad_case(resume_half_model EXPECT "checkpoint-3/model.safetensors.*(truncated|corrupt)"
         SETUP truncated_half_model ARGS --resume_from_checkpoint RUN/checkpoint-3)
bad_case(resume_bad_trainer_state EXPECT "checkpoint-3/trainer_state.json is not valid JSON: .*parse error"
         SETUP bad_state ARGS --resume_from_checkpoint RUN/checkpoint-3)
bad_case(resume_bad_scheduler_json EXPECT "checkpoint-3/scheduler.json is not valid JSON: .*parse error"
         SETUP bad_scheduler ARGS --resume_from_checkpoint RUN/checkpoint-3)
bad_case(resume_wrong_weights EXPECT "checkpoint-3/model.safetensors does not match the model: missing conv1.weight, .* unexpected exp_avg"
         SETUP wrong_weights ARGS --resume_from_checkpoint RUN/checkpoint-3)
bad_case(model_name_or_path_wrong_weights EXPECT "checkpoint-3/model.safetensors does not match the model: missing conv1.weight"
         SETUP wrong_weights ARGS --model_name_or_path RUN/checkpoint-3)
bad_case(model_name_or_path_empty_model EXPECT "checkpoint-3/model.safetensors is not a safetensors file: it has 0 bytes"
         SETUP truncated_empty_model ARGS --model_name_or_path RUN/checkpoint-3)

# The example's own flags.
# (A negative value once reached Tensor::narrow and ended in a libtorch stack trace.)
bad_case(max_train_samples_negative EXPECT "--max_train_samples must be positive, got -1"
         ARGS --max_train_samples -1)
bad_case(max_eval_samples_negative EXPECT "--max_eval_samples must be positive, got -3"
         ARGS --max_eval_samples -3)
bad_case(max_train_samples_zero EXPECT "--max_train_samples must be positive, got 0"
         ARGS --max_train_samples 0)

# ---- not an error: warmup longer than training -------------------------------------------
# HF accepts --warmup_steps above the number of training steps (the rate then never leaves the
# warmup ramp); loom's validate() does not reject it either. Reported, not failed, unless it
# crashes.
execute_process(COMMAND "${EXE}" --warmup_steps 1000 --max_steps 10 --max_eval_samples 256 --disable_tqdm
                        --output_dir "${OUT}/warmup_longer_than_training"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
if(rc STREQUAL "0")
  message("note --warmup_steps 1000 --max_steps 10: accepted, trained 10 steps (as HF)")
  file(REMOVE_RECURSE "${OUT}/warmup_longer_than_training")
elseif(rc STREQUAL "2" AND err MATCHES "(^|\n)loom: [^\n]*\n*$")
  string(REGEX MATCH "loom: [^\n]*" line "${err}")
  message("note --warmup_steps 1000 --max_steps 10: rejected with: ${line}")
else()
  message("FAIL warmup_longer_than_training: exit '${rc}', expected 0 or 2 with a loom: line\n${err}")
  set(FAILURES "${FAILURES}  warmup_longer_than_training\n")
endif()

math(EXPR total "${CASE_NO}")
if(FAILURES)
  message("\n${PASSED} of ${total} bad-input cases ok. Failed (details above):\n${FAILURES}")
  message(FATAL_ERROR "bad input: some cases did not end with one clean loom: line at start-up")
endif()
file(REMOVE_RECURSE "${SEED}")
message("bad input ok: ${total} cases, each one loom: line at start-up")
