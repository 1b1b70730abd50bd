# One compile-fail case: builds TARGET in BUILD_DIR, which must fail with output matching
# EXPECT, in at most MAX_LINES lines of compiler output (the build tool's own lines, and the
# echoed compile command, are not counted): the first error is loom's, and few follow it.
#   cmake -DBUILD_DIR=... -DTARGET=cf_x -DEXPECT=regex [-DONCE=1] -DMAX_LINES=30 -P run_case.cmake
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${BUILD_DIR}" --target "${TARGET}"
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
set(all "${out}${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled, but it must not")
endif()
if(NOT all MATCHES "${EXPECT}")
  message(FATAL_ERROR "${TARGET} failed without the expected message\n  expected: ${EXPECT}\n${all}")
endif()
# ONCE: the message must appear exactly once (not once per Trainer type the program makes).
if(ONCE)
  # A ';' in the message would split a match in two list items: count on text without them.
  string(REPLACE ";" "," all_text "${all}")
  string(REPLACE ";" "," expect_text "${EXPECT}")
  string(REGEX MATCHALL "${expect_text}" matches "${all_text}")
  list(LENGTH matches times)
  if(NOT times EQUAL 1)
    message(FATAL_ERROR "${TARGET}: the expected message appears ${times} times (once expected)\n${all}")
  endif()
endif()
string(REPLACE ";" "," all_lines "${all}")
string(REPLACE "\n" ";" all_lines "${all_lines}")
set(count 0)
foreach(line IN LISTS all_lines)
  # The quoted source lines and caret lines under a diagnostic ("   93 | code", "      | ^~~")
  # are not counted: clang quotes one for every note, GCC for fewer; the diagnostics count.
  if(line STREQUAL "" OR line MATCHES "^\\[[0-9]+/[0-9]+\\]|^FAILED:|^ninja:|^gmake|^make|CMakeFiles/${TARGET}\\.dir"
     OR line MATCHES "^ *[0-9]* \\| ")
    continue()
  endif()
  math(EXPR count "${count} + 1")
endforeach()
if(count GREATER MAX_LINES)
  message(FATAL_ERROR "${TARGET}: ${count} lines of compiler output (at most ${MAX_LINES})\n${all}")
endif()
message(STATUS "${TARGET}: failed as expected, ${count} lines of compiler output")
