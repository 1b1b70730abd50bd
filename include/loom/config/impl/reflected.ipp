#pragma once
// loom::detail::Reflected<TrainingArguments> compiled once (config/reflected.hpp): its
// compile-time checks run here, and its setters and --help lines are defined here, for every
// program that parses TrainingArguments.
#include <loom/config/cli.hpp>
#include <loom/config/reflected_ops.hpp>
#include <loom/config/training_arguments.hpp>

#if defined(LOOM_SEPARATE_COMPILATION)
namespace loom::detail {
template struct Reflected<TrainingArguments>;
}  // namespace loom::detail
#endif
