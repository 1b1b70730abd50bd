#pragma once
// The hooks a Trainer subclass may override (HF names), the types they trade in, and the
// one place that calls them: call_hook<Hook>(self, args...). A subclass member with a
// hook's name that cannot be called with the hook's arguments hides the default and is a
// compile error here, with a "loom:" message naming the hook and its expected form.

#include <loom/config/meta.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/metrics.hpp>
#include <loom/accelerate/outputs.hpp>
#include <loom/data/collate.hpp>

#include <boost/pfr.hpp>
#include <torch/torch.h>

#include <concepts>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom {

namespace detail {
/// Stands in for a batch type that could not be told, after the loom: error that says why:
/// the rest of the Trainer then compiles quietly instead of piling up errors.
struct UnknownBatch {
  torch::Tensor unknown;
};
}  // namespace detail

namespace hook {

// Each hook tag calls `self.NAME(args...)`. The Trainer base defines every hook, so the call
// only fails when the subclass declared NAME with other parameters: then the static_assert
// says so and the base's NAME is called, so no second error follows. With an UnknownBatch
// (the batch type could not be told, already an error) the base's NAME is called quietly.
#define LOOM_DEFINE_HOOK(NAME, EXPECTED)                                                           \
  struct NAME {                                                                                    \
    template <class Self, class... A>                                                              \
    static decltype(auto) call(Self& self, A&&... a) {                                             \
      if constexpr ((std::is_same_v<std::decay_t<A>, detail::UnknownBatch> || ...)) {              \
        return self.loom_trainer::NAME(std::forward<A>(a)...);                                     \
      } else if constexpr (requires { self.NAME(std::forward<A>(a)...); }) {                       \
        return self.NAME(std::forward<A>(a)...);                                                   \
      } else {                                                                                     \
        wrong_signature();                                                                         \
        return self.loom_trainer::NAME(std::forward<A>(a)...);                                     \
      }                                                                                            \
    }                                                                                              \
    /* Keyed on nothing of the Trainer's type: one error for all the Trainer types a program  */ \
    /* instantiates (select_policies makes one per policy combination).                       */ \
    template <class Once = void>                                                                   \
    static void wrong_signature() {                                                                \
      static_assert(dependent_false_v<Once>, "loom: the override of " #NAME                        \
                                             " has the wrong signature; expected " EXPECTED);       \
    }                                                                                              \
  };

LOOM_DEFINE_HOOK(compute_loss, "compute_loss(Model&, Batch&) -> torch::Tensor or loom::ModelOutput")
LOOM_DEFINE_HOOK(training_step, "training_step(Model&, Batch&, double loss_divisor) -> torch::Tensor")
LOOM_DEFINE_HOOK(prediction_step, "prediction_step(Model&, Batch&) -> loom::PredictionOutput")
LOOM_DEFINE_HOOK(num_items, "num_items(const Batch&) -> int64_t")
LOOM_DEFINE_HOOK(create_optimizer, "create_optimizer() -> loom::optim::Optimizer")
LOOM_DEFINE_HOOK(create_scheduler, "create_scheduler(int64_t num_training_steps) -> scheduler_type")
LOOM_DEFINE_HOOK(get_train_dataloader, "get_train_dataloader() -> loom::data::DataLoader<Batch>")
LOOM_DEFINE_HOOK(get_eval_dataloader,
                 "get_eval_dataloader(const loom::data::AnyDataset<Batch>&) -> loom::data::DataLoader<Batch>")
LOOM_DEFINE_HOOK(get_test_dataloader,
                 "get_test_dataloader(const loom::data::AnyDataset<Batch>&) -> loom::data::DataLoader<Batch>")
LOOM_DEFINE_HOOK(floating_point_ops, "floating_point_ops(const Batch&) -> double")
LOOM_DEFINE_HOOK(log, "log(const loom::Metrics&) -> void")
LOOM_DEFINE_HOOK(preprocess_logits_for_metrics,
                 "preprocess_logits_for_metrics(const torch::Tensor& logits, const torch::Tensor& labels) -> "
                 "torch::Tensor")
#undef LOOM_DEFINE_HOOK

/// compute_metrics in HF's two forms: compute_metrics(const EvalPrediction&) over the whole
/// set, and compute_metrics(const EvalPrediction&, bool compute_result), which
/// --batch_eval_metrics calls once per batch (HF's compute_metrics(eval_pred, compute_result)).
/// A subclass declares either or both. The whole-set call takes the second form, with
/// compute_result true, when the subclass declares only that one (one call over the whole set
/// is also the last); the per-batch call needs the second form (`batched`, which the Trainer
/// checks at construction when --batch_eval_metrics is set).
struct compute_metrics {
  template <class Self>
  static constexpr bool whole = requires(Self& s, const EvalPrediction& p) {
    { s.compute_metrics(p) } -> std::convertible_to<Metrics>;
  };
  template <class Self>
  static constexpr bool batched = requires(Self& s, const EvalPrediction& p, bool last) {
    { s.compute_metrics(p, last) } -> std::convertible_to<Metrics>;
  };

  template <class Self>
  static Metrics call(Self& self, const EvalPrediction& p) {
    if constexpr (whole<Self>) {
      return self.compute_metrics(p);
    } else if constexpr (batched<Self>) {
      return self.compute_metrics(p, true);
    } else {
      wrong_signature();
      return self.loom_trainer::compute_metrics(p);
    }
  }
  template <class Self>
  static Metrics call(Self& self, const EvalPrediction& p, bool compute_result) {
    if constexpr (batched<Self>) {
      return self.compute_metrics(p, compute_result);
    } else {
      if constexpr (!whole<Self>) wrong_signature();
      return self.loom_trainer::compute_metrics(p, compute_result);  // unreachable after the constructor's check
    }
  }
  template <class Once = void>
  static void wrong_signature() {
    static_assert(dependent_false_v<Once>,
                  "loom: the override of compute_metrics has the wrong signature; expected "
                  "compute_metrics(const loom::EvalPrediction&) -> loom::Metrics or compute_metrics(const "
                  "loom::EvalPrediction&, bool compute_result) -> loom::Metrics");
  }
};

}  // namespace hook

/// Calls hook `Hook` on `self`: the single dispatch point for every Trainer hook.
template <class Hook, class Self, class... A>
decltype(auto) call_hook(Self& self, A&&... a) {
  return Hook::call(self, std::forward<A>(a)...);
}

namespace detail {

/// True when evaluation can generate on Batch (--predict_with_generate): an
/// evaluation_generate(model, batch, args) found by argument-dependent lookup
/// (models/generation.hpp's, for loom's causal LMs).
template <class Model, class Batch>
inline constexpr bool can_generate = requires(Model& m, const Batch& b, const TrainingArguments& a) {
  evaluation_generate(m, b, a);
};

template <class F>
struct member_fn_args {};
template <class R, class C, class M, class B>
struct member_fn_args<R (C::*)(M, B)> {
  using batch = std::decay_t<B>;
};
template <class R, class C, class M, class B>
struct member_fn_args<R (C::*)(M, B) const> : member_fn_args<R (C::*)(M, B)> {};
template <class R, class C, class M, class B>
struct member_fn_args<R (C::*)(M, B) noexcept> : member_fn_args<R (C::*)(M, B)> {};

// The parameter count of a member function (-1: not a plain member function pointer).
template <class F>
inline constexpr int member_fn_arity = -1;
template <class R, class C, class... A>
inline constexpr int member_fn_arity<R (C::*)(A...)> = sizeof...(A);
template <class R, class C, class... A>
inline constexpr int member_fn_arity<R (C::*)(A...) const> = sizeof...(A);
template <class R, class C, class... A>
inline constexpr int member_fn_arity<R (C::*)(A...) noexcept> = sizeof...(A);

template <class T>
struct forward_arg {};
template <class R, class C, class B>
struct forward_arg<R (C::*)(B)> {
  using batch = std::decay_t<B>;
};

// The errors batch_type_of reports, each a template keyed on nothing of the Trainer's own type,
// so a program that instantiates several Trainer types (select_policies: one per policy
// combination) gets each error once.
template <bool HFSignature>
void wrong_compute_loss() {
  if constexpr (HFSignature)
    static_assert(dependent_false_v<std::bool_constant<HFSignature>>,
                  "loom: the override of compute_loss has the wrong signature; expected compute_loss(Model&, "
                  "Batch&) -> torch::Tensor or loom::ModelOutput (HF's return_outputs parameter has no place "
                  "here: return a loom::ModelOutput holding the logits)");
  else
    static_assert(dependent_false_v<std::bool_constant<HFSignature>>,
                  "loom: the override of compute_loss has the wrong signature; expected compute_loss(Model&, "
                  "Batch&) -> torch::Tensor or loom::ModelOutput");
}
template <class Model>
void batch_type_unknown() {
  static_assert(dependent_false_v<Model>,
                "loom: cannot tell the batch type: the Trainer subclass has no compute_loss(Model&, Batch&) "
                "and the model's forward does not take a batch aggregate; declare compute_loss in the "
                "subclass, or `using batch_type = Batch;` there");
}

// The batch type of a trainer: Self::batch_type if declared; else the second parameter of
// Self's own (non-template) compute_loss; else the parameter of the model's forward when it
// is a batch aggregate. Each failure is one loom: error, and the type is then UnknownBatch.
template <class Self, class Model>
struct batch_type_of {
  using Impl = std::decay_t<decltype(*std::declval<Model&>())>;

  template <class B>
  static constexpr auto checked() {
    if constexpr (!std::is_aggregate_v<B> || !std::is_default_constructible_v<B>) {
      static_assert(dependent_false_v<B>, "loom: the batch type must be an aggregate (a struct) whose fields are "
                                          "torch::Tensor; see the type deduced above (`using batch_type = ...;` or "
                                          "compute_loss's second parameter)");
      return std::type_identity<UnknownBatch>{};
    } else if constexpr (!data::batch_fields_are_tensors<B>()) {
      return std::type_identity<UnknownBatch>{};  // batch_fields_are_tensors named the field
    } else {
      return std::type_identity<B>{};
    }
  }

  static constexpr auto pick() {
    if constexpr (requires { typename Self::batch_type; }) {
      return checked<typename Self::batch_type>();
    } else if constexpr (requires { typename member_fn_args<decltype(&Self::compute_loss)>::batch; }) {
      return checked<typename member_fn_args<decltype(&Self::compute_loss)>::batch>();
    } else if constexpr (requires { &Self::compute_loss; }) {
      wrong_compute_loss<member_fn_arity<decltype(&Self::compute_loss)> == 3>();
      return std::type_identity<UnknownBatch>{};
    } else if constexpr (requires { typename forward_arg<decltype(&Impl::forward)>::batch; } &&
                         data::TensorAggregate<typename forward_arg<decltype(&Impl::forward)>::batch>) {
      return std::type_identity<typename forward_arg<decltype(&Impl::forward)>::batch>{};
    } else {
      batch_type_unknown<Model>();
      return std::type_identity<UnknownBatch>{};
    }
  }
  using type = typename decltype(pick())::type;
};

}  // namespace detail
}  // namespace loom
