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
  set(err "${err}" PARENT_SCOPE)
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

# hf_check(<args>...): runs tests/examples/hf_examples_check.py <args> with ${PYTHON} (the
# venv's, which has transformers) and fails unless it exits 0.
function(hf_check)
  execute_process(COMMAND "${PYTHON}" "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/hf_examples_check.py" ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "hf_examples_check.py ${ARGV0} failed (${rc})")
  endif()
endfunction()

# save_output(<file>): writes the last run_example's output to <file> (for hf_check's --log).
function(save_output file)
  file(WRITE "${file}" "${out}")
endfunction()

# check_files(<dir> <files>...): each of <files> exists in <dir>.
function(check_files dir)
  foreach(f IN LISTS ARGN)
    if(NOT EXISTS "${dir}/${f}")
      message(FATAL_ERROR "missing ${dir}/${f}")
    endif()
  endforeach()
endfunction()

# run_torchrun(<name> <banner> <args>...): runs ${EXE} <args> in 2 processes under ${TORCHRUN}
# (its agent hosts the rendezvous store) into a fresh ${OUT}, fails unless it exits 0, and
# requires the regex <banner> in the output exactly once (rank 0 prints, the other rank not).
function(run_torchrun name banner)
  file(REMOVE_RECURSE "${OUT}")
  execute_process(COMMAND "${TORCHRUN}" --standalone --nproc_per_node=2 --no-python "${EXE}" ${ARGN}
                          --use_cpu --output_dir "${OUT}" --disable_tqdm
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 300)
  message("${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "torchrun ${name} exited with ${rc}")
  endif()
  string(REGEX MATCHALL "${banner}" banners "${out}")
  list(LENGTH banners n)
  if(NOT n EQUAL 1)
    message(FATAL_ERROR "${name}: expected the banner from rank 0 only, got it ${n} times")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

# expect_loom_error(<regex> <args>...): ${EXE} <args> must stop at start-up with exit code 2
# and one stderr line starting "loom: " that matches <regex>, writing no output folder.
function(expect_loom_error regex)
  set(dir "${OUT}/bad_input")
  file(REMOVE_RECURSE "${dir}")
  execute_process(COMMAND "${EXE}" ${ARGN} --output_dir "${dir}" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err TIMEOUT 60)
  string(STRIP "${err}" err)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "^loom: ${regex}$" OR EXISTS "${dir}")
    message(FATAL_ERROR "expected exit code 2 and 'loom: ${regex}' for ${ARGN}, got ${rc}: ${err}")
  endif()
  message("bad input ok: ${err}")
endfunction()

# The files under `dir` with their SHA-256, one "name=hash;" each, into `out_var`.
function(folder_digest dir out_var)
  file(GLOB_RECURSE files LIST_DIRECTORIES false RELATIVE "${dir}" "${dir}/*")
  list(SORT files)
  set(digest "")
  foreach(f IN LISTS files)
    file(SHA256 "${dir}/${f}" h)
    string(APPEND digest "${f}=${h};")
  endforeach()
  set(${out_var} "${digest}" PARENT_SCOPE)
endfunction()

# expect_refusal_keeps(<dir> <regex> <args>...): ${EXE} <args> --output_dir <dir> must stop with
# exit code 2 and one `loom: <regex>` line, leaving every file under <dir> (checkpoints, the
# base) as it was and adding none.
function(expect_refusal_keeps dir regex)
  folder_digest("${dir}" before)
  execute_process(COMMAND "${EXE}" ${ARGN} --output_dir "${dir}" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err TIMEOUT 120)
  string(STRIP "${err}" err)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "^loom: ${regex}$")
    message(FATAL_ERROR "expected exit code 2 and 'loom: ${regex}' for ${ARGN}, got ${rc}: ${err}")
  endif()
  folder_digest("${dir}" after)
  if(NOT before STREQUAL after)
    message(FATAL_ERROR "a refused start changed ${dir}:\nbefore: ${before}\nafter: ${after}")
  endif()
  message("refused, ${dir} kept: ${err}")
endfunction()
