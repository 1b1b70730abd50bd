# Finds what loom::loom needs and defines one imported target per dependency, so the
# build tree and an installed loomConfig.cmake resolve the same names.
#
#   Torch        find_package(Torch): from -DTorch_DIR, CMAKE_PREFIX_PATH, or a Python with
#                torch (torch.utils.cmake_prefix_path): LOOM_PYTHON, else the project venv
#                (a source checkout), else python3 on the PATH, in that order.
#   Boost.PFR    header-only, from the PyPI boost-headers package (>= 1.84 for names).
#   nlohmann     Debian nlohmann-json3-dev.
#   {fmt}        torch's bundled copy, header-only (docs/dependencies.md says why).
#   PCRE2        Debian libpcre2-dev (8-bit library): the tokenizer's pre-tokenizer regexes.
#   utf8proc     Debian libutf8proc-dev: the tokenizer's Unicode categories and normal forms.

include_guard(GLOBAL)

# --- a Python that may know where torch and boost-headers are ------------------------------
# Nothing here is a path of the machine loom was built on: an installed loomConfig.cmake
# includes this file and must work on the consumer's machine, from wherever the prefix lies.
set(_loom_python "${LOOM_PYTHON}")
if(NOT _loom_python AND DEFINED ENV{LOOM_PYTHON})
  set(_loom_python "$ENV{LOOM_PYTHON}")
endif()
if(NOT _loom_python AND EXISTS "${CMAKE_CURRENT_LIST_DIR}/../.venv/bin/python")
  set(_loom_python "${CMAKE_CURRENT_LIST_DIR}/../.venv/bin/python")
endif()
if(NOT _loom_python)
  find_program(_loom_python NAMES python3 python NO_CACHE)
endif()

# Runs `import <module>; print(<expression>)` with that Python; <out> is empty on failure.
function(_loom_python_print out module expression)
  set(${out} "" PARENT_SCOPE)
  if(_loom_python)
    execute_process(COMMAND "${_loom_python}" -c "import ${module}; print(${expression})"
                    OUTPUT_VARIABLE _value OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc ERROR_QUIET)
    if(_rc EQUAL 0)
      set(${out} "${_value}" PARENT_SCOPE)
    endif()
  endif()
endfunction()

# --- Torch -------------------------------------------------------------------------------
if(NOT Torch_DIR AND NOT TARGET torch)
  _loom_python_print(_loom_torch_prefix torch.utils "torch.utils.cmake_prefix_path")
  if(_loom_torch_prefix)
    list(APPEND CMAKE_PREFIX_PATH "${_loom_torch_prefix}")
  endif()
endif()
if(NOT TARGET torch)
  # torch's cuda.cmake (run by TorchConfig when torch was built with CUDA and a CUDA toolkit
  # is found) copies CMAKE_CXX_STANDARD into an unset CMAKE_CUDA_STANDARD, enables CUDA and
  # compiles a probe. A consumer with set(CMAKE_CXX_STANDARD 20) thus asks nvcc for the
  # dialect CUDA20, for which CMake before 3.25.2 has no flag ("requires the language dialect
  # CUDA20 ... CMake does not know the flags to enable it"), and nvcc before 12 none at all.
  # loom compiles no CUDA code and torch's CUDA headers are C++17, so the probe runs as C++17;
  # the caller's CMAKE_CUDA_STANDARD is then unset again, as it was, so its own CUDA targets
  # follow its own settings. A CMAKE_CUDA_STANDARD the caller set is left alone.
  set(_loom_pinned_cuda_standard OFF)
  if(NOT DEFINED CMAKE_CUDA_STANDARD)
    set(CMAKE_CUDA_STANDARD 17)
    set(_loom_pinned_cuda_standard ON)
  endif()
  find_package(Torch QUIET)
  if(_loom_pinned_cuda_standard)
    unset(CMAKE_CUDA_STANDARD)
  endif()
  if(NOT Torch_FOUND)
    message(FATAL_ERROR "loom: libtorch not found. Pass -DTorch_DIR=<libtorch>/share/cmake/Torch, add it to "
                        "CMAKE_PREFIX_PATH, or pass -DLOOM_PYTHON=<a python with torch installed>")
  endif()
endif()

# --- Boost.PFR -----------------------------------------------------------------------------
if(NOT TARGET loom::boost_pfr)
  set(_loom_pfr_hints "${LOOM_PFR_INCLUDE_DIR}")
  if(NOT LOOM_PFR_INCLUDE_DIR)
    _loom_python_print(_loom_pfr_py boost_headers "boost_headers.get_include()")
    list(APPEND _loom_pfr_hints "${_loom_pfr_py}")
  endif()
  find_path(LOOM_PFR_INCLUDE_DIR boost/pfr/core_name.hpp HINTS ${_loom_pfr_hints}
            DOC "folder holding boost/pfr.hpp (Boost >= 1.84)")
  if(NOT LOOM_PFR_INCLUDE_DIR)
    message(FATAL_ERROR "loom: Boost.PFR >= 1.84 not found; pip install boost-headers (into the Python "
                        "LOOM_PYTHON names) or set LOOM_PFR_INCLUDE_DIR")
  endif()
  add_library(loom::boost_pfr INTERFACE IMPORTED GLOBAL)
  set_target_properties(loom::boost_pfr PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${LOOM_PFR_INCLUDE_DIR}"
    INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${LOOM_PFR_INCLUDE_DIR}")
endif()

# --- nlohmann/json -------------------------------------------------------------------------
if(NOT TARGET nlohmann_json::nlohmann_json)
  find_package(nlohmann_json 3.10 REQUIRED)
endif()
if(NOT TARGET ZLIB::ZLIB)
  find_package(ZLIB REQUIRED)
endif()

# --- {fmt} ---------------------------------------------------------------------------------
# torch's public headers (c10d TraceUtils.h, c10/util/strong_type.h) include <fmt/...> and
# torch's include folder precedes /usr/include, so every TU that sees torch uses torch's
# copy anyway. loom uses that same copy, header-only, everywhere.
if(NOT TARGET loom::fmt)
  add_library(loom::fmt INTERFACE IMPORTED GLOBAL)
  set(_loom_fmt_found FALSE)
  foreach(_dir IN LISTS TORCH_INCLUDE_DIRS)
    if(EXISTS "${_dir}/fmt/format.h")
      set(_loom_fmt_found TRUE)
    endif()
  endforeach()
  if(_loom_fmt_found)
    set_target_properties(loom::fmt PROPERTIES INTERFACE_COMPILE_DEFINITIONS FMT_HEADER_ONLY=1)
  else()
    find_package(fmt REQUIRED)
    set_target_properties(loom::fmt PROPERTIES INTERFACE_LINK_LIBRARIES fmt::fmt-header-only)
  endif()
endif()

# --- PCRE2 and utf8proc (data/tokenizer.hpp) --------------------------------------------
# Only data/impl/tokenizer.ipp includes their headers; the libraries are small shared ones.
# Debian ships neither a CMake package nor (for utf8proc) one every release agrees on, so
# both are found by header and library name.
foreach(_loom_dep IN ITEMS "pcre2|pcre2.h|pcre2-8|libpcre2-dev" "utf8proc|utf8proc.h|utf8proc|libutf8proc-dev")
  string(REPLACE "|" ";" _loom_dep "${_loom_dep}")
  list(GET _loom_dep 0 _name)
  list(GET _loom_dep 1 _header)
  list(GET _loom_dep 2 _lib)
  list(GET _loom_dep 3 _package)
  string(TOUPPER "${_name}" _upper)
  if(NOT TARGET loom::${_name})
    find_path(LOOM_${_upper}_INCLUDE_DIR ${_header})
    find_library(LOOM_${_upper}_LIBRARY ${_lib})
    if(NOT LOOM_${_upper}_INCLUDE_DIR OR NOT LOOM_${_upper}_LIBRARY)
      message(FATAL_ERROR "loom: ${_name} (${_header}, lib${_lib}) was not found; install Debian's ${_package} "
                          "(make deps does) or pass -DLOOM_${_upper}_INCLUDE_DIR=<dir> -DLOOM_${_upper}_LIBRARY=<file>")
    endif()
    add_library(loom::${_name} UNKNOWN IMPORTED)
    set_target_properties(loom::${_name} PROPERTIES IMPORTED_LOCATION "${LOOM_${_upper}_LIBRARY}"
                          INTERFACE_INCLUDE_DIRECTORIES "${LOOM_${_upper}_INCLUDE_DIR}")
  endif()
endforeach()

# --- c10d (torch.distributed from C++) -------------------------------------------------
# libtorch carries ProcessGroupGloo and ProcessGroupNCCL but its wheel ships neither Gloo's
# nor NCCL's headers. Gloo's come from Debian's libgloo-dev (only declarations are used; the
# code is libtorch's own copy); NCCL's from the nvidia-nccl wheel torch depends on, or the
# system. Without nccl.h (or without CUDA) loom compiles the Gloo path only.
if(NOT TARGET loom::c10d)
  add_library(loom::c10d INTERFACE IMPORTED)
  find_path(LOOM_GLOO_INCLUDE_DIR gloo/algorithm.h)
  if(NOT LOOM_GLOO_INCLUDE_DIR)
    message(FATAL_ERROR "loom: Gloo's headers (gloo/algorithm.h) were not found; install Debian's libgloo-dev "
                        "(make deps does) or pass -DLOOM_GLOO_INCLUDE_DIR=<dir>")
  endif()
  set(_loom_c10d_defs USE_C10D_GLOO)
  set(_loom_c10d_includes "${LOOM_GLOO_INCLUDE_DIR}")
  if(TORCH_CUDA_LIBRARIES OR TARGET torch_cuda)
    set(_loom_nccl_hints "${LOOM_NCCL_INCLUDE_DIR}")
    if(Torch_DIR)
      # <site-packages>/torch/share/cmake/Torch -> <site-packages>/nvidia/nccl/include
      get_filename_component(_loom_site "${Torch_DIR}/../../../.." ABSOLUTE)
      list(APPEND _loom_nccl_hints "${_loom_site}/nvidia/nccl/include")
    endif()
    find_path(LOOM_NCCL_INCLUDE_DIR nccl.h HINTS ${_loom_nccl_hints})
    if(LOOM_NCCL_INCLUDE_DIR)
      list(APPEND _loom_c10d_defs USE_C10D_NCCL LOOM_HAVE_NCCL)
      list(APPEND _loom_c10d_includes "${LOOM_NCCL_INCLUDE_DIR}")
    else()
      message(STATUS "loom: nccl.h not found; CUDA runs will have no process group (set LOOM_NCCL_INCLUDE_DIR)")
    endif()
  endif()
  set_target_properties(loom::c10d PROPERTIES
    INTERFACE_COMPILE_DEFINITIONS "${_loom_c10d_defs}"
    INTERFACE_INCLUDE_DIRECTORIES "${_loom_c10d_includes}")
  message(STATUS "loom: c10d backends: ${_loom_c10d_defs}")
endif()

# Imported targets are visible only in the directory that found them; loom may be added
# with add_subdirectory, so make what loom::loom links to visible to the whole project.
get_property(_loom_imported DIRECTORY PROPERTY IMPORTED_TARGETS)
foreach(_target IN LISTS _loom_imported)
  get_target_property(_loom_global ${_target} IMPORTED_GLOBAL)
  if(NOT _loom_global)
    set_target_properties(${_target} PROPERTIES IMPORTED_GLOBAL TRUE)
  endif()
endforeach()
