#pragma once
// HF's --optim_args: "key=value" pairs separated by commas, spaces ignored
// ("momentum=0.9,nesterov=True"). HF reads a few keys per optimizer and ignores the rest;
// loom accepts the same keys and refuses any other, so a typo is an error at start-up.
//
// Each optimizer's keys and their ranges are in its catalog entry (policy/tags.hpp,
// OptimizerCatalog): sgd momentum, dampening, nesterov; adagrad lr_decay, eps,
// initial_accumulator_value; rmsprop momentum, alpha, eps, centered; lion beta1, beta2
// (loom's own; defaults 0.9, 0.99); adafactor beta1, decay_rate, clip_threshold.
//
// HF also reads weight_decay for sgd, adagrad and rmsprop, but its decay groups carry their own
// weight decay, so the value never takes effect there; loom refuses it and names --weight_decay.

#include <loom/config/inline.hpp>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

/// The --optim_args of `optim` as (key, value) pairs in the order given; booleans read as 1 or 0.
/// Throws loom::Error for a malformed pair, a key `optim` does not take, a key given twice or a
/// value out of range.
LOOM_INLINE std::vector<std::pair<std::string, double>> parse_optim_args(std::string_view optim,
                                                                         std::string_view text);

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/config/impl/optim_args.ipp>
#endif
