#pragma once
// The one interface every optimizer update rule implements (torch.optim's layout: one rule per
// file, optim/rules/, behind one class, optim/optimizer.hpp's Optimizer). A rule is a struct of
// static members, checked by the UpdateRule concept:
//
//   name             its HF --optim name (the only place inside optim/ that spells it)
//   id               its Algorithm value, written to checkpoints
//   steps_pieces     whether it can step flat pieces of parameters (what ZeRO-1/2 and FullShard
//                    hand each rank); false when it needs whole tensors
//   lazy_state       true when step() creates a parameter's state itself (SGD's momentum buffer
//                    starts as the first gradient); else Optimizer creates initial_state() before
//                    the first step, and a checkpoint must hold all of it
//   skips_on_device  true when step() applies the fp16 overflow skip itself on the device
//                    (GroupStep::found_inf); else Optimizer reads the flag on the host first
//   read_args        its OptimizerOptions from TrainingArguments and the --optim_args pairs
//   initial_state    a parameter's state tensors, under torch's state names
//   step             one update of one parameter group (GroupStep)
//   validate         optional: loom::Errors for options or groups the rule cannot run
//
// optim/catalog.hpp lists the rules; Optimizer looks its rule up there once, on construction,
// and makes one call through the Rule record per group per step. State I/O, the step counts and
// the lr of each group stay in Optimizer, shared by every rule.

#include <loom/config/inline.hpp>
#include <loom/config/meta.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/optim/param_groups.hpp>
#include <loom/policy/tags.hpp>

#include <torch/torch.h>

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::optim {

/// Which update rule an Optimizer applies (the values are written to checkpoints; append only).
enum class Algorithm { adamw_fused, adamw_foreach, sgd, adagrad, rmsprop, adafactor, lion, torch };

/// Hyper-parameters shared by every group, one struct for every rule: each rule reads the fields
/// its file lists and ignores the others. Defaults are torch.optim's / HF's; where rules differ
/// (Adagrad's eps, Lion's beta2), the rule's read_args sets its own.
struct OptimizerOptions {
  Algorithm algorithm = Algorithm::adamw_fused;  ///< update rule
  double beta1 = 0.9;                            ///< AdamW and Lion beta1
  double beta2 = 0.999;                          ///< AdamW beta2; Lion's is 0.99 (options_from_args)
  double eps = 1e-8;                             ///< AdamW and RMSprop epsilon; Adagrad's is 1e-10
  double momentum = 0.0;                         ///< SGD and RMSprop momentum
  double dampening = 0.0;                        ///< SGD dampening
  bool nesterov = false;                         ///< SGD Nesterov momentum
  double lr_decay = 0.0;                         ///< Adagrad learning-rate decay
  double initial_accumulator_value = 0.0;        ///< Adagrad's initial sum of squares
  double alpha = 0.99;                           ///< RMSprop smoothing constant
  bool centered = false;                         ///< RMSprop: normalize by the centered variance
  std::array<double, 2> adafactor_eps = {1e-30, 1e-3};  ///< Adafactor (eps1, eps2)
  double clip_threshold = 1.0;                   ///< Adafactor update clipping
  double decay_rate = -0.8;                      ///< Adafactor second-moment decay exponent
  std::optional<double> adafactor_beta1;         ///< Adafactor first moment (none: not kept)
  bool scale_parameter = false;                  ///< Adafactor: scale lr by the parameter's RMS (HF Trainer: false)
  bool relative_step = false;                    ///< Adafactor: time-dependent lr instead of lr (HF Trainer: false)
  bool warmup_init = false;                      ///< Adafactor: warm-up relative steps
};

/// One parameter's state tensors by kind (torch's state names: exp_avg, step, ...), empty until
/// created.
using ParamState = std::vector<std::pair<std::string, torch::Tensor>>;

/// --optim_args as parse_optim_args returns it: (key, value) pairs, booleans as 1 or 0, already
/// checked against the keys the rule takes.
using OptimArgs = std::vector<std::pair<std::string, double>>;

/// One update of one parameter group, as Optimizer hands it to a rule: the group's parameters
/// that have a gradient, their state, the learning rate and step count.
struct GroupStep {
  const OptimizerOptions& options;      ///< the optimizer's options
  std::vector<ParamState>& state;       ///< the state of every parameter of the group, by index
  double lr;                            ///< this group's learning rate for this step
  double weight_decay;                  ///< this group's weight decay
  int64_t t;                            ///< steps taken, this one included (host count)
  const torch::Tensor& found_inf;       ///< fp16 overflow flag for a rule that skips_on_device, else undefined
  std::vector<torch::Tensor> params{};  ///< the stepped parameters (detached), in group order
  std::vector<torch::Tensor> grads{};   ///< their gradients (a rule may replace the vector, not the tensors)
  std::vector<std::size_t> slots{};     ///< their indices in the group
  std::vector<torch::Tensor> steps{};   ///< their "step" state tensors, already counting this step

  /// The state tensors of kind `kind` of the stepped parameters, in `slots` order.
  [[nodiscard]] std::vector<torch::Tensor> state_of(std::string_view kind) const;
};

/// A state tensor shaped like `p` (its dtype, device and memory format), zero.
LOOM_INLINE torch::Tensor zeros_like_param(const torch::Tensor& p);
/// A step-count state tensor for `p`: a float32 scalar on p's device, zero (torch's "step").
LOOM_INLINE torch::Tensor step_count(const torch::Tensor& p);

/// What makes a struct an update rule (the list at the top of this file).
template <class R>
concept UpdateRule = requires(OptimizerOptions& o, const TrainingArguments& args, const OptimArgs& optim_args,
                              const torch::Tensor& p, GroupStep& s) {
  { R::name } -> std::convertible_to<std::string_view>;
  { R::id } -> std::convertible_to<Algorithm>;
  { R::steps_pieces } -> std::convertible_to<bool>;
  { R::lazy_state } -> std::convertible_to<bool>;
  { R::skips_on_device } -> std::convertible_to<bool>;
  R::read_args(o, args, optim_args);
  { R::initial_state(p, std::as_const(o)) } -> std::same_as<ParamState>;
  R::step(s);
};

/// A rule's static members as one record, so Optimizer can hold the rule --optim chose at run
/// time (optim/catalog.hpp builds one per rule of OptimizerRules).
struct Rule {
  Algorithm id;                 ///< checkpoint id
  std::string_view name;        ///< HF --optim name
  bool steps_pieces;            ///< can step flat pieces of parameters
  bool lazy_state;              ///< step() creates the state itself
  bool skips_on_device;         ///< step() applies the fp16 overflow skip on the device
  void (*read_args)(OptimizerOptions&, const TrainingArguments&, const OptimArgs&);  ///< see UpdateRule
  ParamState (*initial_state)(const torch::Tensor&, const OptimizerOptions&);        ///< see UpdateRule
  void (*step)(GroupStep&);                                                           ///< see UpdateRule
  void (*validate)(const OptimizerOptions&, const std::vector<ParamGroup>&);         ///< null when none
};

/// The Rule record of update rule `R`.
template <class R>
constexpr Rule rule_of() {
  static_assert(UpdateRule<R>, "loom: an optimizer rule needs the static members listed in optim/rule.hpp");
  Rule r{R::id, R::name, R::steps_pieces, R::lazy_state, R::skips_on_device, &R::read_args, &R::initial_state,
         &R::step, nullptr};
  if constexpr (requires(const OptimizerOptions& o, const std::vector<ParamGroup>& g) { R::validate(o, g); })
    r.validate = &R::validate;
  return r;
}

/// The update rule of an optimizer of OptimizerCatalog (policy/tags.hpp): each rule file
/// specializes it for its tag, and optim/catalog.hpp maps the catalog through it.
template <class Tag>
struct RuleFor {
  static_assert(dependent_false_v<Tag>, "loom: no update rule for this optimizer tag; specialize "
                                      "loom::optim::RuleFor<Tag> in its rule file and include that file from "
                                      "loom/optim/catalog.hpp");
};

}  // namespace loom::optim

#if defined(LOOM_HEADER_ONLY)
#include <loom/optim/impl/rule.ipp>
#endif
