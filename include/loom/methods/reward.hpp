#pragma once
// Reward modelling as TRL's RewardTrainer (trl/trainer/reward_trainer.py, TRL 1.16), on loom's
// Trainer: a sequence classifier with one label (a reward model, such as
// models::LlamaForSequenceClassification with num_labels 1) learns to score the chosen
// completion of a preference pair above the rejected one.
//
//   using RM = loom::models::LlamaForSequenceClassification;
//   loom::methods::RewardTrainer<RM> trainer(reward_args, args, model, pairs);  // pairs: PreferenceBatch rows
//   trainer.train();
//
// Each batch goes through the model as one forward: the chosen rows, then the rejected rows,
// padded to one length with the model's pad_token_id, the batch's longest (TRL's
// DataCollatorForPreference). The
// loss is TRL's: -log sigmoid(r_chosen - r_rejected - margin), the mean over the pairs (margin:
// the batch's optional column), plus center_rewards_coefficient x mean((r_chosen +
// r_rejected)^2) when set. Logged beside the loss, averaged over the steps since the last log
// (training) or over the evaluation (with eval_), TRL's metrics: min_reward, mean_reward,
// max_reward (over every reward of the batch, all ranks), accuracy (chosen > rejected) and
// margin (r_chosen - r_rejected; each the mean of the ranks' means), num_tokens (the tokens
// trained on so far, all ranks).

#include <loom/config/field_help.hpp>
#include <loom/config/reflect.hpp>
#include <loom/data/preference.hpp>
#include <loom/methods/logged_metrics.hpp>
#include <loom/methods/pairs.hpp>
#include <loom/trainer/trainer.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::methods {

/// TRL's RewardConfig fields beyond TrainingArguments (parse_args reads them beside it).
struct RewardArguments {
  std::optional<double> center_rewards_coefficient;  ///< TRL's: adds this x mean((r_chosen + r_rejected)^2) to the loss, keeping the rewards centred on 0

  static constexpr loom::FieldHelp field_help[] = {
      {"center_rewards_coefficient",
       "TRL's: adds this x mean((r_chosen + r_rejected)^2) to the loss, keeping the rewards centred on 0"},
  };
  static constexpr std::string_view help_heading = "reward modelling (TRL's RewardConfig)";
};

/// Preference pairs (data/preference.hpp): the chosen and the rejected token rows, their
/// attention masks, labels (unused here) and an optional margin; data::PreferenceDataset reads
/// prepare.py --preference's files into them.
using PreferenceBatch = data::PreferenceBatch;


/// TRL's RewardTrainer: loom's Trainer with the pairwise loss and TRL's metrics (see the file
/// comment). Model: a module holder whose forward takes a data::SequenceBatch and returns
/// {loss, logits} with logits [rows, 1], and whose config() has pad_token_id.
template <class Model, class... Policies>
class RewardTrainer : public Trainer<RewardTrainer<Model, Policies...>, Model, Policies...> {
  using Base = Trainer<RewardTrainer<Model, Policies...>, Model, Policies...>;

 public:
  /// The Trainer's constructors, with TRL's reward arguments first.
  template <class... A>
  explicit RewardTrainer(RewardArguments reward, A&&... a) : Base(std::forward<A>(a)...), reward_(reward) {}

  /// TRL's compute_loss: one forward of the chosen and rejected rows, the pairwise loss, the
  /// metrics recorded for the next log.
  ModelOutput compute_loss(Model& model, PreferenceBatch& batch) {
    const auto pad = model->config().pad_token_id;
    check(pad.has_value(), "RewardTrainer: the model's config has no pad_token_id; a batch of pairs is padded with "
                           "it (set pad_token_id in config.json)");
    const auto pairs_joined = join_pairs(batch, *pad, /*labels=*/false, "RewardTrainer");
    const int64_t pairs = pairs_joined.pairs;
    const data::SequenceBatch joined{pairs_joined.input_ids, pairs_joined.attention_mask, torch::Tensor()};
    auto out = model->forward(joined);
    check(out.logits.dim() == 2 && out.logits.size(1) == 1,
          "RewardTrainer: the model must give one reward per row (num_labels 1), got logits of shape {}",
          c10::str(out.logits.sizes()));
    const auto rewards = out.logits.squeeze(-1);
    const auto chosen = rewards.narrow(0, 0, pairs), rejected = rewards.narrow(0, pairs, pairs);
    auto difference = chosen - rejected;
    if (batch.margin.defined()) difference = difference - batch.margin.to(difference.device(), difference.scalar_type());
    auto loss = -torch::log_sigmoid(difference).mean();
    if (reward_.center_rewards_coefficient)
      loss = loss + *reward_.center_rewards_coefficient * (chosen + rejected).pow(2).mean();
    record(model->is_training(), rewards.detach(), chosen.detach(), rejected.detach(), joined.attention_mask);
    return {loss, torch::stack({chosen, rejected}, 1).detach()};
  }

  /// TRL's log: the metrics recorded since the last log, averaged, beside `logs` (with eval_
  /// when the model is evaluating), then the Trainer's log.
  void log(const Metrics& logs) {
    const bool training = this->model()->is_training();
    using detail::Combine;
    const std::vector<Combine> combine{Combine::sum, Combine::sum, Combine::sum, Combine::min,
                                       Combine::max, Combine::sum, Combine::sum, Combine::sum};
    for (const auto& s : sums_.reduce(this->accelerator(), training, combine)) {
      if (training) total_tokens_ += static_cast<int64_t>(s[0]);
      metrics_.set(training, "num_tokens", static_cast<double>(total_tokens_));
      metrics_.append(training, "min_reward", s[3]);
      metrics_.append(training, "mean_reward", s[1] / s[2]);
      metrics_.append(training, "max_reward", s[4]);
      metrics_.append(training, "accuracy", s[5] / s[7]);
      metrics_.append(training, "margin", s[6] / s[7]);
    }
    Base::log(metrics_.merged(logs, training));
  }

  /// The reward arguments.
  [[nodiscard]] const RewardArguments& reward_args() const { return reward_; }

 private:
  // TRL's _metrics[mode]: min/mean/max of every reward of the batch on all ranks, the mean of
  // the ranks' accuracies and margins, and the tokens trained on so far (reduced in log()).
  void record(bool training, const torch::Tensor& rewards, const torch::Tensor& chosen, const torch::Tensor& rejected,
              const torch::Tensor& attention_mask) {
    // This rank's: tokens, the rewards' sum, count, min and max, its accuracy and margin (TRL
    // averages the ranks' means), one rank; log() combines them over the ranks.
    const auto r = rewards.to(torch::kDouble);
    const auto v = torch::stack({attention_mask.sum().to(torch::kDouble), r.sum(),
                                 torch::tensor(static_cast<double>(r.numel()), r.options()), r.min(), r.max(),
                                 chosen.gt(rejected).to(torch::kFloat).mean().to(torch::kDouble),
                                 (chosen - rejected).to(torch::kFloat).mean().to(torch::kDouble),
                                 torch::ones({}, r.options())})
                       .cpu();
    sums_.add(training, std::vector<double>(v.template data_ptr<double>(), v.template data_ptr<double>() + v.numel()));
  }

  RewardArguments reward_;
  int64_t total_tokens_ = 0;
  detail::RankSums sums_;
  detail::LoggedMetrics metrics_;
};

}  // namespace loom::methods
