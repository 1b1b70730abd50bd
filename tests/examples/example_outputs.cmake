# Shared by the example smoke runs: run_example(<name> <args>...) runs ${EXE} with <args>
# into ${OUT} and fails unless it exits 0; check_outputs(<steps> <keys>...) checks the files
# HF users expect (save_model's model.safetensors and training_args.json included), that
# all_results.json holds <keys>, and trainer_state.json's global_step (check_global_step).
function(run_example name)
  file(REMOVE_RECURSE "${OUT}")
  execute_process(COMMAND "${EXE}" ${ARGN} --output_dir "${OUT}" --disable_tqdm
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name} exited with ${rc}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

function(check_outputs steps)
  foreach(f trainer_state.json all_results.json train_results.json eval_results.json model.safetensors
            training_args.json)
    if(NOT EXISTS "${OUT}/${f}")
      message(FATAL_ERROR "missing ${OUT}/${f}")
    endif()
  endforeach()
  file(READ "${OUT}/all_results.json" all)
  foreach(key IN LISTS ARGN)
    string(JSON value ERROR_VARIABLE e GET "${all}" ${key})
    if(e)
      message(FATAL_ERROR "all_results.json has no ${key}")
    endif()
  endforeach()
  check_global_step("${OUT}" ${steps})
endfunction()

# check_global_step(<dir> <steps>): <dir>/trainer_state.json's global_step is <steps>.
function(check_global_step dir steps)
  file(READ "${dir}/trainer_state.json" state)
  string(JSON global_step GET "${state}" global_step)
  if(NOT global_step EQUAL steps)
    message(FATAL_ERROR "trainer_state.json global_step is ${global_step}, expected ${steps}")
  endif()
endfunction()
