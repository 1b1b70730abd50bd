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

# Imported targets are visible only in the directory that found them; loom may be added
# with add_subdirectory, so make what loom::loom links to visible to the whole project.
get_property(_loom_imported DIRECTORY PROPERTY IMPORTED_TARGETS)
foreach(_target IN LISTS _loom_imported)
  get_target_property(_loom_global ${_target} IMPORTED_GLOBAL)
  if(NOT _loom_global)
    set_target_properties(${_target} PROPERTIES IMPORTED_GLOBAL TRUE)
  endif()
endforeach()
