#pragma once
// How loom's non-template code is compiled (the pattern of {fmt}'s FMT_HEADER_ONLY and
// Asio's separate compilation):
//
//   header-only (the default)   every header includes its own impl/*.ipp at its end, so
//                               `#include <loom/loom.hpp>` is all a program needs;
//   LOOM_SEPARATE_COMPILATION   the impl/*.ipp files are compiled once into the
//                               loom::compiled library (CMake defines the macro for every
//                               target that links it), and a program's translation units
//                               see declarations only.
//
// A function defined in an impl/*.ipp file is marked LOOM_INLINE: `inline` when header-only,
// nothing when compiled once.

#if defined(LOOM_SEPARATE_COMPILATION)
#define LOOM_INLINE
#else
#define LOOM_HEADER_ONLY 1
#define LOOM_INLINE inline
#endif
