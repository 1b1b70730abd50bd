#pragma once
// The runtime selector: maps command-line choices onto a fixed set of instantiations, so a
// program can pick a strategy with a flag without losing compile-time dispatch.
//
//   template <class Sharding, class Precision>
//   struct MyTrainer : loom::Trainer<MyTrainer<Sharding, Precision>, Net, Sharding, Precision> {...};
//   loom::select_policies(args, [&]<class Sharding, class Precision>() {
//     MyTrainer<Sharding, Precision> t(args, ...);
//     t.train();
//   });
//
// --sharding no|ddp|zero1|zero2|full_shard picks the sharding tag (auto, the default: ddp
// when WORLD_SIZE > 1, else no); --bf16 picks
// precision::BF16, --fp16 precision::FP16, neither precision::FP32. All 15 combinations are
// instantiated (each is a whole Trainer: a program that needs one should name its types).
// select_precision is the one-dimensional form for programs that do not shard.

#include <loom/config/training_arguments.hpp>
#include <loom/core/error.hpp>
#include <loom/distributed/env.hpp>
#include <loom/policy/tags.hpp>

#include <utility>

namespace loom {

/// Calls `f.template operator()<Precision>()` with the precision tag the arguments name.
template <class F>
decltype(auto) select_precision(const TrainingArguments& args, F&& f) {
  check(!(args.bf16 && args.fp16), "--bf16 and --fp16 are both set; choose one");
  if (args.bf16) return std::forward<F>(f).template operator()<precision::BF16>();
  if (args.fp16) return std::forward<F>(f).template operator()<precision::FP16>();
  return std::forward<F>(f).template operator()<precision::FP32>();
}

/// The --sharding a program runs: `auto` (the default) is ddp when torchrun started several
/// processes (WORLD_SIZE > 1), as HF's Trainer then trains under DDP, and no otherwise.
inline std::string resolved_sharding(const TrainingArguments& args) {
  if (args.sharding != "auto") return args.sharding;
  return dist::world_from_env().size > 1 ? "ddp" : "no";
}

/// Calls `f.template operator()<Sharding, Precision>()` with the tags the arguments name.
template <class F>
decltype(auto) select_policies(const TrainingArguments& args, F&& f) {
  auto with_sharding = [&]<class Sharding>() {
    return select_precision(args, [&]<class Precision>() {
      return std::forward<F>(f).template operator()<Sharding, Precision>();
    });
  };
  const std::string s = resolved_sharding(args);
  if (s == "ddp") return with_sharding.template operator()<sharding::DDP>();
  if (s == "zero1") return with_sharding.template operator()<sharding::ZeRO1>();
  if (s == "zero2") return with_sharding.template operator()<sharding::ZeRO2>();
  if (s == "full_shard") return with_sharding.template operator()<sharding::FullShard>();
  check(s == "no", "--sharding {} is not one of auto, no, ddp, zero1, zero2, full_shard", s);
  return with_sharding.template operator()<sharding::NoShard>();
}

}  // namespace loom
