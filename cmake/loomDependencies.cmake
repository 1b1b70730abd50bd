# Finds what loom::loom needs and defines one imported target per dependency, so the
# build tree and an installed loomConfig.cmake resolve the same names.
#
#   Torch        find_package(Torch): from -DTorch_DIR, CMAKE_PREFIX_PATH, or the
#                project venv (torch.utils.cmake_prefix_path), in that order.
#   Boost.PFR    header-only, from the PyPI boost-headers package (>= 1.84 for names).
#   nlohmann     Debian nlohmann-json3-dev.
#   {fmt}        torch's bundled copy, header-only (docs/dependencies.md says why).

include_guard(GLOBAL)

# --- Torch -------------------------------------------------------------------------------
if(NOT Torch_DIR AND NOT TARGET torch)
  set(_loom_python "${LOOM_PYTHON}")
  if(NOT _loom_python AND EXISTS "${CMAKE_CURRENT_LIST_DIR}/../.venv/bin/python")
    set(_loom_python "${CMAKE_CURRENT_LIST_DIR}/../.venv/bin/python")
  endif()
  if(_loom_python)
    execute_process(
      COMMAND "${_loom_python}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE _loom_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE _loom_rc ERROR_QUIET)
    if(_loom_rc EQUAL 0 AND _loom_torch_prefix)
      list(APPEND CMAKE_PREFIX_PATH "${_loom_torch_prefix}")
    endif()
  endif()
endif()
if(NOT TARGET torch)
  find_package(Torch REQUIRED)
endif()

# --- Boost.PFR -----------------------------------------------------------------------------
if(NOT TARGET loom::boost_pfr)
  set(_loom_pfr_hints "${LOOM_PFR_INCLUDE_DIR}")
  if(_loom_python)
    execute_process(
      COMMAND "${_loom_python}" -c "import boost_headers; print(boost_headers.get_include())"
      OUTPUT_VARIABLE _loom_pfr_py OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE _loom_rc ERROR_QUIET)
    if(_loom_rc EQUAL 0)
      list(APPEND _loom_pfr_hints "${_loom_pfr_py}")
    endif()
  endif()
  find_path(LOOM_PFR_INCLUDE_DIR boost/pfr/core_name.hpp HINTS ${_loom_pfr_hints}
            DOC "folder holding boost/pfr.hpp (Boost >= 1.84)")
  if(NOT LOOM_PFR_INCLUDE_DIR)
    message(FATAL_ERROR "loom: Boost.PFR >= 1.84 not found; pip install boost-headers or set LOOM_PFR_INCLUDE_DIR")
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
