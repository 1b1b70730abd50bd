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
#include <loom/trainer/trainer.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <map>
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

namespace detail {
/// `a` [rows, n] and `b` [rows, m] one above the other, the shorter padded on the right with
/// `value` to the longer's width.
inline torch::Tensor stack_padded(const torch::Tensor& a, const torch::Tensor& b, int64_t value) {
  const int64_t width = std::max(a.size(1), b.size(1));
  const auto pad = [&](const torch::Tensor& t) {
    return t.size(1) == width ? t : torch::constant_pad_nd(t, {0, width - t.size(1)}, static_cast<double>(value));
  };
  return torch::cat({pad(a), pad(b)});
}
}  // namespace detail

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
    const int64_t pairs = batch.chosen_input_ids.size(0);
    const auto mask_of = [](const torch::Tensor& m, const torch::Tensor& ids) {
      return m.defined() ? m : torch::ones_like(ids);
    };
    data::SequenceBatch joined{
        detail::stack_padded(batch.chosen_input_ids, batch.rejected_input_ids, *pad),
        detail::stack_padded(mask_of(batch.chosen_attention_mask, batch.chosen_input_ids),
                             mask_of(batch.rejected_attention_mask, batch.rejected_input_ids), 0),
        torch::Tensor()};
    // The columns after the last token of every row dropped, as DataCollatorForPreference pads
    // to the batch's longest row (the same rewards; the products then have TRL's shapes).
    if (const auto used = joined.attention_mask.ne(0).any(0).nonzero(); used.numel() > 0) {
      const int64_t width = used.max().template item<int64_t>() + 1;
      if (width < joined.input_ids.size(1)) {
        joined.input_ids = joined.input_ids.narrow(1, 0, width);
        joined.attention_mask = joined.attention_mask.narrow(1, 0, width);
      }
    }
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
    auto& recorded = metrics_[training ? 0 : 1];
    Metrics entry = logs;
    for (const auto& [name, values] : recorded) {
      double sum = 0;
      for (double v : values) sum += v;
      entry.set((training ? "" : "eval_") + name, values.empty() ? 0.0 : sum / static_cast<double>(values.size()));
    }
    recorded.clear();
    Base::log(entry);
  }

  /// The reward arguments.
  [[nodiscard]] const RewardArguments& reward_args() const { return reward_; }

 private:
  // TRL's _metrics[mode]: min/mean/max of every reward of the batch on all ranks, the mean of
  // the ranks' accuracies and margins, and the tokens trained on so far.
  void record(bool training, const torch::Tensor& rewards, const torch::Tensor& chosen, const torch::Tensor& rejected,
              const torch::Tensor& attention_mask) {
    auto& acc = this->accelerator();
    auto& m = metrics_[training ? 0 : 1];
    const int64_t world = acc.world().size;
    if (training) total_tokens_ += acc.reduce_sum(attention_mask.sum().to(torch::kLong)).template item<int64_t>();
    m["num_tokens"] = {static_cast<double>(total_tokens_)};
    const auto all = world > 1 ? acc.gather_for_metrics(rewards.to(torch::kFloat)) : rewards.to(torch::kFloat);
    m["min_reward"].push_back(all.min().template item<double>());
    m["mean_reward"].push_back(all.mean().template item<double>());
    m["max_reward"].push_back(all.max().template item<double>());
    const auto across = [&](const torch::Tensor& local) {
      return (world > 1 ? acc.reduce_sum(local) / static_cast<double>(world) : local).template item<double>();
    };
    m["accuracy"].push_back(across(chosen.gt(rejected).to(torch::kFloat).mean()));
    m["margin"].push_back(across((chosen - rejected).to(torch::kFloat).mean()));
  }

  RewardArguments reward_;
  int64_t total_tokens_ = 0;
  std::map<std::string, std::vector<double>> metrics_[2];  // [0] training, [1] evaluation
};

}  // namespace loom::methods
