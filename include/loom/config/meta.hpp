#pragma once
// Compile-time helpers every layer shares.

namespace loom {

/// False once `T` is known: the condition of a static_assert that fires only when the template
/// holding it is instantiated (a primary template that must be specialized, a branch that must
/// not be taken).
template <class T>
inline constexpr bool dependent_false_v = false;

}  // namespace loom
