# Shared settings for loom's own tests, examples and benchmarks (not for consumers).
#
# Compiling <torch/torch.h> costs ~20 s per translation unit on the 2-core dev machine, so
# every loom executable reuses ONE precompiled header built by loom_pch, and ccache is
# used when present (the Makefile sets the sloppiness that lets ccache cache PCH users).

find_program(LOOM_CCACHE ccache)
if(LOOM_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER "${LOOM_CCACHE}" CACHE STRING "" FORCE)
endif()

if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
  set(CMAKE_BUILD_TYPE Release CACHE STRING "" FORCE)
endif()

add_library(loom_build_options INTERFACE)
target_link_libraries(loom_build_options INTERFACE loom::loom)
target_compile_options(loom_build_options INTERFACE -Wall -Wextra -Wno-unused-parameter)

add_library(loom_pch OBJECT "${CMAKE_CURRENT_LIST_DIR}/pch.cpp")
target_link_libraries(loom_pch PUBLIC loom_build_options)
target_precompile_headers(loom_pch PRIVATE "${CMAKE_CURRENT_LIST_DIR}/pch.hpp")

# loom_add_executable(name sources...): an executable that reuses the shared PCH.
function(loom_add_executable name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE loom_build_options)
  target_precompile_headers(${name} REUSE_FROM loom_pch)
endfunction()
