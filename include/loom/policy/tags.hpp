#pragma once
// The policy catalog: cheap, empty tag types, one family each. A Trainer names any of
// them, in any order, after its Model type; policy/bundle.hpp resolves them. The code that
// gives a tag meaning lives in precision/, schedule/, distributed/ (one file per tag).

#include <string_view>

namespace loom {

/// Policy families; a tag names its family through a nested `loom_family` type.
namespace family {
struct Sharding {};   ///< how parameters, gradients and optimizer state are laid out
struct Precision {};  ///< the numeric format of forward/backward
struct Schedule {};   ///< the learning-rate schedule
struct Callbacks {};  ///< the pack of user callbacks
}  // namespace family

namespace sharding {
/// One process, or every process holding everything (the default).
struct NoShard {
  using loom_family = family::Sharding;
  static constexpr std::string_view name = "no";
};
}  // namespace sharding

namespace precision {
/// float32 everywhere (the default).
struct FP32 {
  using loom_family = family::Precision;
  static constexpr std::string_view name = "fp32";
};
}  // namespace precision

namespace schedule {
/// The schedule named by TrainingArguments::lr_scheduler_type, chosen at run time (the default).
struct FromArgs {
  using loom_family = family::Schedule;
  static constexpr std::string_view name = "";
};
/// Linear warmup, then linear decay to 0 (HF "linear").
struct Linear {
  using loom_family = family::Schedule;
  static constexpr std::string_view name = "linear";
};
/// Constant learning rate (HF "constant").
struct Constant {
  using loom_family = family::Schedule;
  static constexpr std::string_view name = "constant";
};
/// Linear warmup, then constant (HF "constant_with_warmup").
struct ConstantWithWarmup {
  using loom_family = family::Schedule;
  static constexpr std::string_view name = "constant_with_warmup";
};
/// Linear warmup, then half a cosine wave down to 0 (HF "cosine").
struct Cosine {
  using loom_family = family::Schedule;
  static constexpr std::string_view name = "cosine";
};
}  // namespace schedule

/// A pack of callbacks: any types with some of HF's event members; no base class.
template <class... Cbs>
struct Callbacks {
  using loom_family = family::Callbacks;
};

}  // namespace loom
