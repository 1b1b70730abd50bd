# Builds and runs a tiny consumer of loom, either through find_package(loom) from an install
# of this build, or through add_subdirectory of the source tree. Both consumers set
# CMAKE_CXX_STANDARD 20 in their own CMakeLists, as a user's project does.
#
# find_package: installs into a staging prefix, then moves (renames) it, so that a path
# recorded at install time points nowhere; fails if any installed file holds the source or
# build folder's absolute path; then configures the consumer against the moved prefix,
# finding torch and Boost.PFR only through what COMMON gives (a Python with torch).
file(REMOVE_RECURSE "${WORK_DIR}")
set(extra)
if(MODE STREQUAL "find_package")
  set(staging "${WORK_DIR}/staging")
  set(prefix "${WORK_DIR}/moved/prefix")
  execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BINARY_DIR}" --prefix "${staging}"
                  RESULT_VARIABLE rc OUTPUT_QUIET)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "installing loom failed")
  endif()
  file(MAKE_DIRECTORY "${WORK_DIR}/moved")
  file(RENAME "${staging}" "${prefix}")

  # Every installed file, text or binary (file(STRINGS) reads the printable runs, as strings(1)).
  file(GLOB_RECURSE installed LIST_DIRECTORIES false "${prefix}/*")
  list(LENGTH installed count)
  if(count LESS 10)
    message(FATAL_ERROR "the install holds ${count} files; expected the headers, the library and the config")
  endif()
  set(leaks)
  foreach(file IN LISTS installed)
    file(STRINGS "${file}" text)
    foreach(path IN ITEMS "${SOURCE_DIR}" "${BINARY_DIR}" "${staging}")
      string(FIND "${text}" "${path}" at)
      if(at GREATER -1)
        string(SUBSTRING "${text}" ${at} 160 context)
        list(APPEND leaks "${file}: ...${context}")
        break()
      endif()
    endforeach()
  endforeach()
  if(leaks)
    list(JOIN leaks "\n  " shown)
    message(FATAL_ERROR "installed files hold absolute paths of this machine's build:\n  ${shown}")
  endif()
  message("checked ${count} installed files: no absolute path of the build")
  set(extra "-DCMAKE_PREFIX_PATH=${prefix}")
else()
  set(extra "-DLOOM_SOURCE_DIR=${SOURCE_DIR}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" -S "${CONSUMER}" -B "${WORK_DIR}/build" -G Ninja ${COMMON} ${extra}
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the consumer failed")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${WORK_DIR}/build" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the consumer failed")
endif()
execute_process(COMMAND "${WORK_DIR}/build/consumer" RESULT_VARIABLE rc OUTPUT_VARIABLE out)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the consumer failed")
endif()
