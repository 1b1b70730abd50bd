#pragma once
// The runtime selector: maps command-line choices onto a fixed set of instantiations, so a
// program can pick a strategy with a flag without losing compile-time dispatch.
//
//   template <class Precision> struct MyTrainer : loom::Trainer<MyTrainer<Precision>, Net, Precision> {...};
//   loom::select_policies(args, [&]<class Precision>() { MyTrainer<Precision> t(args, ...); t.train(); });
//
// --bf16 picks precision::BF16, --fp16 precision::FP16, neither precision::FP32.

#include <loom/config/training_arguments.hpp>
#include <loom/core/error.hpp>
#include <loom/policy/tags.hpp>

#include <utility>

namespace loom {

/// Calls `f.template operator()<Precision>()` with the precision tag the arguments name.
template <class F>
decltype(auto) select_policies(const TrainingArguments& args, F&& f) {
  check(!(args.bf16 && args.fp16), "--bf16 and --fp16 are both set; choose one");
  if (args.bf16) return std::forward<F>(f).template operator()<precision::BF16>();
  if (args.fp16) return std::forward<F>(f).template operator()<precision::FP16>();
  return std::forward<F>(f).template operator()<precision::FP32>();
}

}  // namespace loom
