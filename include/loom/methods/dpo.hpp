#pragma once
// Direct preference optimization as TRL's DPOTrainer (trl/trainer/dpo_trainer.py, TRL 1.16),
// on loom's Trainer: a causal LM (the policy) learns to give each chosen completion more
// probability, relative to a frozen reference, than the rejected one.
//
//   using LM = loom::models::LlamaForCausalLM;
//   loom::methods::DPOTrainer<LM> trainer(dpo_args, args, model, pairs);  // pairs: PreferenceBatch rows
//   trainer.train();
//
// Each batch goes through the policy as one forward: the chosen rows, then the rejected rows
// (join_pairs), and each completion's log-probability is the sum of its tokens' (the LM head at
// the scored positions only, models::token_scores). The reference, without gradient, is
//   - the model given as ReferenceModel{...};
//   - else, when the policy carries a LoRA adapter, the policy with the adapter off
//     (peft::DisabledAdapters: PEFT's trick, no second copy);
//   - else, with precompute_ref_log_probs, the policy as given, once over the data before
//     training (the batches then carry ref_chosen_logps / ref_rejected_logps);
//   - else a frozen copy of the policy as given, made at construction.
// The loss is TRL's (methods/dpo_loss.hpp: loss types, f-divergences, ld_alpha). Logged beside
// the loss, averaged over the steps since the last log (eval_ in evaluation), TRL's metrics over
// all ranks: rewards/chosen, rewards/rejected (beta x the log-ratios), rewards/accuracies,
// rewards/margins, logps/chosen, logps/rejected, logits/chosen, logits/rejected (the mean logit
// over the vocabulary, per completion token), entropy (per completion token), mean_token_accuracy
// (the chosen completions' tokens the policy ranks first) and num_tokens (trained on so far),
// each step's reduced over the ranks when logged.
//
// Rows must be right-padded (data::PreferenceDataset's are): the causal attention then never
// sees a padding token from a real one, so no attention mask is needed.

#include <loom/data/preference.hpp>
#include <loom/methods/dpo_loss.hpp>
#include <loom/methods/logged_metrics.hpp>
#include <loom/methods/pairs.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/peft/lora.hpp>
#include <loom/trainer/trainer.hpp>

#include <torch/torch.h>

#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace loom::methods {

/// The reference model DPO compares against, given explicitly (a frozen model of the policy's
/// type; DPOTrainer moves it to the policy's device and never trains it).
template <class Model>
struct ReferenceModel {
  Model model;
};

namespace detail {

/// A preference dataset whose batches carry the reference's log-probabilities computed once
/// (DPO's precompute_ref_log_probs); without them (undefined), its batches are the data's.
template <class D>
class WithReferenceLogps {
 public:
  WithReferenceLogps(D data, torch::Tensor chosen, torch::Tensor rejected)
      : data_(std::move(data)), chosen_(std::move(chosen)), rejected_(std::move(rejected)) {}
  [[nodiscard]] int64_t size() const { return static_cast<int64_t>(data_.size()); }
  [[nodiscard]] data::PreferenceBatch get_batch(std::span<const int64_t> indices) const {
    auto batch = data_.get_batch(indices);
    if (chosen_.defined()) {
      const auto at = torch::tensor(std::vector<int64_t>(indices.begin(), indices.end()), torch::kLong);
      batch.ref_chosen_logps = chosen_.index_select(0, at);
      batch.ref_rejected_logps = rejected_.index_select(0, at);
    }
    return batch;
  }
  [[nodiscard]] int64_t length(int64_t i) const
    requires requires(const D& d, int64_t k) { d.length(k); }
  {
    return data_.length(i);
  }
  [[nodiscard]] int64_t max_sequence_length() const
    requires requires(const D& d) { d.max_sequence_length(); }
  {
    return data_.max_sequence_length();
  }

 private:
  D data_;
  torch::Tensor chosen_, rejected_;
};

/// The position-aligned mask of the scored labels: true at position t when labels[t + 1] is
/// scored (token_scores' placement), [rows, width].
inline torch::Tensor scored_positions(const torch::Tensor& labels) {
  return torch::constant_pad_nd(labels.narrow(1, 1, labels.size(1) - 1).ne(data::ignore_index), {0, 1}, 0);
}

/// Each row's completion log-probability from its per-position ones: their sum, or with
/// `ld_alpha` LD-DPO's (the positions past the shorter side's completion length weighted by
/// it), as TRL's _compute_loss.
inline torch::Tensor completion_logps(const torch::Tensor& per_position, const torch::Tensor& scored,
                                      std::optional<double> ld_alpha) {
  if (!ld_alpha) return per_position.sum(1);
  const auto place = scored.to(torch::kLong).cumsum(1);
  const auto lengths = scored.sum(1);
  const int64_t pairs = lengths.size(0) / 2;
  const auto shared = torch::minimum(lengths.narrow(0, 0, pairs), lengths.narrow(0, pairs, pairs)).repeat({2});
  const auto shared_mask = place.gt(0).logical_and(place.le(shared.unsqueeze(1)));
  const auto tail_mask = place.gt(shared.unsqueeze(1));
  return (per_position * shared_mask).sum(1) + *ld_alpha * (per_position * tail_mask).sum(1);
}

/// Dropout off in every torch::nn::Dropout of `module` and on the input of every LoRA adapter
/// (TRL's disable_dropout_in_model, which zeroes each nn.Dropout, PEFT's lora_dropout among them).
inline void disable_dropout(torch::nn::Module& module) {
  for (auto& m : module.modules(/*include_self=*/true)) {
    if (auto* d = dynamic_cast<torch::nn::DropoutImpl*>(m.get())) d->options.p(0.0);
    if (auto* layer = dynamic_cast<peft::AdaptableLinearImpl*>(m.get())) layer->set_lora_dropout(0.0);
  }
}

/// The reference side of DPOTrainer, built before the Trainer (a base class listed first): the
/// reference model or how to get one, and the precomputed log-probabilities.
template <class Model>
class DPOReference {
 protected:
  DPOReference(DPOArguments dpo, const TrainingArguments& args, Model policy, std::optional<Model> given)
      : dpo_(std::move(dpo)), spec_(validate_dpo_arguments(dpo_)), policy_(std::move(policy)),
        train_batch_(dpo_.precompute_ref_batch_size.value_or(args.per_device_train_batch_size)),
        eval_batch_(dpo_.precompute_ref_batch_size.value_or(args.per_device_eval_batch_size)) {
    if (given) {
      frozen_ = std::move(*given);
    } else if (const auto adapter = peft::adapter_config(*policy_)) {
      // PEFT's disable_adapter: the base alone. Modules trained whole are not part of the base.
      check(adapter->modules_to_save.empty() && adapter->task_type != "SEQ_CLS",
            "DPOTrainer: the policy's LoRA adapter trains whole modules (modules_to_save), so the base with the "
            "adapter off is not the model DPO started from; pass a ReferenceModel");
      adapter_off_ = true;
    } else if (!dpo_.precompute_ref_log_probs) {
      frozen_ = frozen_copy();
    }
    if (frozen_) {
      (*frozen_)->eval();
      for (auto& p : (*frozen_)->parameters()) p.set_requires_grad(false);
    }
    if (dpo_.disable_dropout) {
      disable_dropout(*policy_);
      if (frozen_) disable_dropout(**frozen_);
    }
  }

  /// `data` with the reference's log-probabilities of every pair when they are precomputed
  /// (`training`: the training set's batch size), else as it is.
  template <class D>
  WithReferenceLogps<D> with_reference(D data, bool training) {
    static_assert(data::BatchDataset<D> && std::is_same_v<data::batch_t<D>, data::PreferenceBatch>,
                  "loom: DPOTrainer reads batches of data::PreferenceBatch from a dataset with get_batch "
                  "(data::PreferenceDataset, data::TensorDataset<PreferenceBatch>)");
    if (!dpo_.precompute_ref_log_probs) return {std::move(data), {}, {}};
    // The reference once over the data, in order (TRL's _precompute_ref_logps), on the
    // policy's device, in evaluation mode and without gradient.
    torch::NoGradGuard no_grad;
    const bool was_training = policy_->is_training();
    policy_->eval();
    const int64_t n = static_cast<int64_t>(data.size()), batch = training ? train_batch_ : eval_batch_;
    std::vector<torch::Tensor> chosen, rejected;
    for (int64_t start = 0; start < n; start += batch) {
      std::vector<int64_t> indices;
      for (int64_t i = start; i < std::min(n, start + batch); ++i) indices.push_back(i);
      const auto pairs = join_pairs(data.get_batch(indices), pad_id(), true, "DPOTrainer");
      const auto logps = reference_logps(pairs, device()).cpu();
      chosen.push_back(logps.narrow(0, 0, pairs.pairs));
      rejected.push_back(logps.narrow(0, pairs.pairs, pairs.pairs));
    }
    policy_->train(was_training);
    if (n == 0) return {std::move(data), torch::empty({0}), torch::empty({0})};
    return {std::move(data), torch::cat(chosen), torch::cat(rejected)};
  }

  /// The reference's completion log-probabilities of `pairs` ([2 pairs]: chosen, then rejected),
  /// without gradient, on `device`.
  torch::Tensor reference_logps(const JoinedPairs& pairs, const torch::Device& device) {
    torch::NoGradGuard no_grad;
    const data::CausalLMBatch batch{pairs.input_ids.to(device), pairs.labels.to(device)};
    torch::Tensor per_position;
    if (frozen_) {
      auto& ref = *frozen_;
      if (const auto params = ref->parameters(); !params.empty() && params.front().device() != device) ref->to(device);
      per_position = ref->token_scores(batch).log_probs;
    } else if (adapter_off_) {
      const peft::DisabledAdapters off;
      per_position = policy_->token_scores(batch).log_probs;
    } else {
      per_position = policy_->token_scores(batch).log_probs;  // the policy before training (precompute)
    }
    return completion_logps(per_position, scored_positions(batch.labels), dpo_.ld_alpha);
  }

  [[nodiscard]] int64_t pad_id() const {
    if constexpr (requires { policy_->config().pad_token_id.value_or(0); })
      return policy_->config().pad_token_id.value_or(0);  // any id: right padding is never attended nor scored
    else
      return 0;
  }

  DPOArguments dpo_;
  DPOLossSpec spec_;
  Model policy_;
  std::optional<Model> frozen_;
  bool adapter_off_ = false;

 private:
  [[nodiscard]] torch::Device device() const {
    const auto params = policy_->parameters();
    return params.empty() ? torch::Device(torch::kCPU) : params.front().device();
  }

  // A frozen copy of the policy as given: the same config, its parameters and buffers cloned.
  Model frozen_copy() {
    if constexpr (requires { Model(policy_->config()); }) {
      Model copy(policy_->config());
      if constexpr (requires { copy->set_kernels(policy_->kernels()); }) copy->set_kernels(policy_->kernels());
      torch::NoGradGuard no_grad;
      const auto take = [](auto from, auto to, const char* what) {
        check(from.size() == to.size(), "DPOTrainer: the reference copy has {} {}, the policy {}", to.size(), what,
              from.size());
        for (const auto& item : from) {
          auto* target = to.find(item.key());
          check(target != nullptr, "DPOTrainer: the reference copy has no {} '{}'", what, item.key());
          target->set_data(item.value().detach().clone());
        }
      };
      take(policy_->named_parameters(), copy->named_parameters(), "parameters");
      take(policy_->named_buffers(), copy->named_buffers(), "buffers");
      return copy;
    } else {
      fail("DPOTrainer: this model cannot be copied from its config() for the reference; pass a ReferenceModel, "
           "or set precompute_ref_log_probs");
    }
  }

  int64_t train_batch_, eval_batch_;
};

}  // namespace detail

/// TRL's DPOTrainer: loom's Trainer with DPO's loss and TRL's metrics (see the file comment).
/// Model: a causal LM's module holder with token_scores(CausalLMBatch, statistics) (loom's
/// LlamaForCausalLM, GPT2LMHeadModel).
template <class Model, class... Policies>
class DPOTrainer : private detail::DPOReference<Model>,
                   public Trainer<DPOTrainer<Model, Policies...>, Model, Policies...> {
  using Reference = detail::DPOReference<Model>;
  using Base = Trainer<DPOTrainer<Model, Policies...>, Model, Policies...>;

 public:
  /// DPO of `model` on the pairs of `train` (and `eval`), the reference as the file comment says.
  template <data::Dataset Train>
  DPOTrainer(DPOArguments dpo, TrainingArguments args, Model model, Train train)
      : Reference(std::move(dpo), args, model, std::nullopt),
        Base(std::move(args), model, Reference::with_reference(std::move(train), true)) {}
  template <data::Dataset Train, data::Dataset Eval>
  DPOTrainer(DPOArguments dpo, TrainingArguments args, Model model, Train train, Eval eval)
      : Reference(std::move(dpo), args, model, std::nullopt),
        Base(std::move(args), model, Reference::with_reference(std::move(train), true),
             Reference::with_reference(std::move(eval), false)) {}
  /// The same against an explicit reference model.
  template <data::Dataset Train>
  DPOTrainer(DPOArguments dpo, ReferenceModel<Model> ref, TrainingArguments args, Model model, Train train)
      : Reference(std::move(dpo), args, model, std::move(ref.model)),
        Base(std::move(args), model, Reference::with_reference(std::move(train), true)) {}
  template <data::Dataset Train, data::Dataset Eval>
  DPOTrainer(DPOArguments dpo, ReferenceModel<Model> ref, TrainingArguments args, Model model, Train train,
             Eval eval)
      : Reference(std::move(dpo), args, model, std::move(ref.model)),
        Base(std::move(args), model, Reference::with_reference(std::move(train), true),
             Reference::with_reference(std::move(eval), false)) {}

  /// TRL's _compute_loss: one forward of the chosen and rejected rows, the reference's
  /// log-probabilities (precomputed, or a forward without gradient), the loss; the metrics
  /// recorded for the next log. The logits returned (compute_metrics' predictions) are the
  /// rewards [pairs, 2]: beta x each side's log-ratio.
  ModelOutput compute_loss(Model& model, data::PreferenceBatch& batch) {
    const auto pairs = join_pairs(batch, this->pad_id(), /*labels=*/true, "DPOTrainer");
    const int64_t n = pairs.pairs;
    const auto device = pairs.input_ids.device();
    const auto scores = model->token_scores(data::CausalLMBatch{pairs.input_ids, pairs.labels}, /*statistics=*/true);
    const auto scored = detail::scored_positions(pairs.labels);
    const auto logps = detail::completion_logps(scores.log_probs, scored, this->dpo_.ld_alpha);
    torch::Tensor ref;
    if (batch.ref_chosen_logps.defined()) {
      ref = torch::cat({batch.ref_chosen_logps, batch.ref_rejected_logps}).to(device, torch::kFloat);
    } else {
      check(this->frozen_ || this->adapter_off_,
            "DPOTrainer: this batch has no precomputed reference log-probabilities and there is no reference model "
            "(precompute_ref_log_probs with full fine-tuning keeps none); give the dataset at construction, or pass "
            "a ReferenceModel");
      ref = this->reference_logps(pairs, device);
    }
    detail::DPOTerms t;
    t.chosen_logps = logps.narrow(0, 0, n), t.rejected_logps = logps.narrow(0, n, n);
    t.ref_chosen_logps = ref.narrow(0, 0, n), t.ref_rejected_logps = ref.narrow(0, n, n);
    const auto lengths = pairs.labels.ne(data::ignore_index).sum(1).to(torch::kFloat);  // TRL's completion_mask sums
    t.chosen_lengths = lengths.narrow(0, 0, n), t.rejected_lengths = lengths.narrow(0, n, n);
    t.chosen_token_logps = scores.log_probs.narrow(0, 0, n), t.chosen_token_mask = scored.narrow(0, 0, n);
    const auto loss = detail::dpo_loss(t, this->dpo_, this->spec_);
    const auto chosen_rewards = this->dpo_.beta * (t.chosen_logps - t.ref_chosen_logps).detach();
    const auto rejected_rewards = this->dpo_.beta * (t.rejected_logps - t.ref_rejected_logps).detach();
    record(model->is_training(), pairs, scores, scored, t, chosen_rewards, rejected_rewards);
    return {loss, torch::stack({chosen_rewards, rejected_rewards}, 1)};
  }

  /// TRL's log: the metrics recorded since the last log, averaged, beside `logs` (with eval_
  /// when the model is evaluating), then the Trainer's log. Each step's sums are reduced over
  /// the ranks here, in one collective (logged_metrics.hpp says why not in compute_loss).
  void log(const Metrics& logs) {
    const bool training = this->model()->is_training();
    const auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
    for (const auto& s : sums_.reduce(this->accelerator(), training, std::vector(15, detail::Combine::sum))) {
      metrics_.append(training, "entropy", ratio(s[0], s[1]));
      if (training) total_tokens_ += static_cast<int64_t>(s[2]);
      metrics_.set(training, "num_tokens", static_cast<double>(total_tokens_));
      metrics_.append(training, "logits/chosen", ratio(s[3], s[4]));
      metrics_.append(training, "logits/rejected", ratio(s[5], s[6]));
      metrics_.append(training, "mean_token_accuracy", ratio(s[7], s[4]));
      metrics_.append(training, "rewards/chosen", ratio(s[8], s[14]));
      metrics_.append(training, "rewards/rejected", ratio(s[9], s[14]));
      metrics_.append(training, "rewards/accuracies", ratio(s[10], s[14]));
      metrics_.append(training, "rewards/margins", ratio(s[11], s[14]));
      metrics_.append(training, "logps/chosen", ratio(s[12], s[14]));
      metrics_.append(training, "logps/rejected", ratio(s[13], s[14]));
    }
    Base::log(metrics_.merged(logs, training));
  }

  /// The DPO arguments.
  [[nodiscard]] const DPOArguments& dpo_args() const { return this->dpo_; }

 private:
  // This rank's sums behind TRL's _metrics[mode] for one batch (one host read); log() reduces them.
  void record(bool training, const JoinedPairs& pairs, const loom::models::TokenScores& scores, const torch::Tensor& scored,
              const detail::DPOTerms& t, const torch::Tensor& chosen_rewards, const torch::Tensor& rejected_rewards) {
    torch::NoGradGuard no_grad;
    const int64_t n = pairs.pairs;
    const auto f = [](const torch::Tensor& x) { return x.to(torch::kDouble).sum(); };
    const auto mask = scored.to(torch::kDouble);
    const auto chosen_mask = mask.narrow(0, 0, n), rejected_mask = mask.narrow(0, n, n);
    const auto sums = torch::stack({
                                       f(scores.entropy.to(torch::kDouble) * mask),
                                       f(mask),
                                       f(pairs.attention_mask),
                                       f(scores.mean_logits.narrow(0, 0, n).to(torch::kDouble) * chosen_mask),
                                       f(chosen_mask),
                                       f(scores.mean_logits.narrow(0, n, n).to(torch::kDouble) * rejected_mask),
                                       f(rejected_mask),
                                       f(scores.is_top1.narrow(0, 0, n).to(torch::kDouble) * chosen_mask),
                                       f(chosen_rewards),
                                       f(rejected_rewards),
                                       f(chosen_rewards.gt(rejected_rewards)),
                                       f(chosen_rewards - rejected_rewards),
                                       f(t.chosen_logps.detach()),
                                       f(t.rejected_logps.detach()),
                                   })
                          .cpu();
    std::vector<double> values(sums.template data_ptr<double>(), sums.template data_ptr<double>() + sums.numel());
    values.push_back(static_cast<double>(n));
    sums_.add(training, std::move(values));
  }

  int64_t total_tokens_ = 0;
  detail::RankSums sums_;
  detail::LoggedMetrics metrics_;
};

}  // namespace loom::methods
