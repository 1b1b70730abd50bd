#pragma once
// DPO's arguments and losses as TRL's DPOConfig and DPOTrainer._compute_loss define them
// (TRL 1.16): from each pair's summed completion log-probabilities under the policy and the
// reference, the scores of the f-divergence, then each loss type's per-pair loss, averaged and
// weighted. The trainer (methods/dpo.hpp) computes the log-probabilities; this file only the
// arithmetic, so that it can be read against TRL's line by line.

#include <loom/config/field_help.hpp>
#include <loom/core/error.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::methods {

/// TRL's DPOConfig fields beyond TrainingArguments (parse_args reads them beside it; the names
/// and defaults are TRL's). The data's own options (max_length and truncation) are the
/// dataset's: data::SftOptions.
struct DPOArguments {
  double beta = 0.1;                                ///< deviation from the reference: higher stays closer (IPO's tau)
  std::string loss_type = "sigmoid";               ///< comma-separated, summed with loss_weights: sigmoid, hinge, ipo, robust, exo_pair, nca_pair, bco_pair, sppo_hard, aot, aot_unpaired, apo_zero, apo_down, discopop, sft, sigmoid_norm
  std::string loss_weights;                        ///< comma-separated weights, one per loss type (empty: 1 each)
  double label_smoothing = 0.0;                    ///< robust DPO's flip probability in [0, 0.5); EXO's epsilon; aot's smoothing
  std::string f_divergence_type = "reverse_kl";    ///< reverse_kl (standard DPO), forward_kl, js_divergence, alpha_divergence
  double f_alpha_divergence_coef = 0.5;            ///< alpha of alpha_divergence
  std::optional<double> ld_alpha;                  ///< LD-DPO: the completion's tokens past the shorter side's length weighted by this, in [0, 1]
  double discopop_tau = 0.05;                      ///< DiscoPOP's temperature (loss_type discopop)
  bool precompute_ref_log_probs = false;           ///< the reference's log-probabilities computed once before training, no reference forward in the steps
  std::optional<int64_t> precompute_ref_batch_size;  ///< pairs per batch of that pass (default: the per-device batch size)
  bool disable_dropout = true;                     ///< dropout off in the policy and the reference
  bool use_weighting = false;                      ///< WPO weighting (not implemented by loom: refused)
  bool sync_ref_model = false;                     ///< TR-DPO's reference updates (not implemented by loom: refused)

  static constexpr loom::FieldHelp field_help[] = {
      {"beta", "deviation from the reference: higher stays closer (IPO's tau)"},
      {"loss_type",
       "comma-separated, summed with loss_weights: sigmoid, hinge, ipo, robust, exo_pair, nca_pair, bco_pair, "
       "sppo_hard, aot, aot_unpaired, apo_zero, apo_down, discopop, sft, sigmoid_norm"},
      {"loss_weights", "comma-separated weights, one per loss type (empty: 1 each)"},
      {"label_smoothing", "robust DPO's flip probability in [0, 0.5); EXO's epsilon; aot's smoothing"},
      {"f_divergence_type", "reverse_kl (standard DPO), forward_kl, js_divergence, alpha_divergence"},
      {"f_alpha_divergence_coef", "alpha of alpha_divergence"},
      {"ld_alpha", "LD-DPO: the completion's tokens past the shorter side's length weighted by this, in [0, 1]"},
      {"discopop_tau", "DiscoPOP's temperature (loss_type discopop)"},
      {"precompute_ref_log_probs",
       "the reference's log-probabilities computed once before training, no reference forward in the steps"},
      {"precompute_ref_batch_size", "pairs per batch of that pass (default: the per-device batch size)"},
      {"disable_dropout", "dropout off in the policy and the reference"},
      {"use_weighting", "WPO weighting (not implemented by loom: refused)"},
      {"sync_ref_model", "TR-DPO's reference updates (not implemented by loom: refused)"},
  };
  static constexpr std::string_view help_heading = "preference optimization (TRL's DPOConfig)";
};

namespace detail {

inline constexpr std::string_view dpo_loss_types[] = {
    "sigmoid",   "hinge",   "ipo",      "robust",   "exo_pair", "nca_pair", "bco_pair",    "sppo_hard",
    "aot",       "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft",      "sigmoid_norm"};

// The loss types TRL's f-divergence generalization applies to.
inline constexpr std::string_view f_divergence_loss_types[] = {"sigmoid", "sigmoid_norm", "hinge", "ipo",
                                                               "exo_pair", "robust", "discopop", "sft"};

/// The loss types of DPOArguments and their weights, checked.
struct DPOLossSpec {
  std::vector<std::string> types;
  std::vector<double> weights;
};

inline std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  for (char c : text + ",") {
    if (c == ',') {
      if (!word.empty()) words.push_back(word);
      word.clear();
    } else if (c != ' ') {
      word += c;
    }
  }
  return words;
}

/// Checks `a` as TRL's DPOConfig and DPOTrainer do, refusing (loom::Error, naming the field)
/// what TRL only warns about where the loss would be meaningless; returns the loss spec.
inline DPOLossSpec validate_dpo_arguments(const DPOArguments& a) {
  DPOLossSpec spec;
  spec.types = split_words(a.loss_type);
  check(!spec.types.empty(), "--loss_type is empty; give one or more of sigmoid, hinge, ipo, ... (comma-separated)");
  for (const auto& t : spec.types) {
    const bool known = std::find(std::begin(dpo_loss_types), std::end(dpo_loss_types), t) != std::end(dpo_loss_types);
    std::string all;
    for (auto k : dpo_loss_types) all += (all.empty() ? "" : ", ") + std::string(k);
    check(known, "--loss_type '{}' is not a DPO loss; TRL 1.16's are {}", t, all);
  }
  if (a.loss_weights.empty()) {
    spec.weights.assign(spec.types.size(), 1.0);
  } else {
    for (const auto& w : split_words(a.loss_weights)) {
      std::size_t used = 0;
      double value = 0;
      try {
        value = std::stod(w, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      check(used == w.size() && std::isfinite(value), "--loss_weights: '{}' is not a number", w);
      spec.weights.push_back(value);
    }
    check(spec.weights.size() == spec.types.size(),
          "--loss_weights has {} weights for {} loss types (--loss_type {}); give one weight per loss type",
          spec.weights.size(), spec.types.size(), a.loss_type);
  }
  check(std::isfinite(a.beta) && a.beta > 0, "--beta must be positive, got {}", a.beta);
  const auto uses = [&](std::string_view t) { return std::find(spec.types.begin(), spec.types.end(), t) != spec.types.end(); };
  check(std::isfinite(a.label_smoothing) && a.label_smoothing >= 0 && a.label_smoothing < 1,
        "--label_smoothing must be in [0, 1), got {}", a.label_smoothing);
  check(!uses("robust") || a.label_smoothing < 0.5,
        "--label_smoothing {} with --loss_type robust: robust DPO's flip probability must be below 0.5 (the loss "
        "divides by 1 - 2 x label_smoothing)", a.label_smoothing);
  check(a.label_smoothing == 0 || uses("robust") || uses("exo_pair") || uses("aot") || uses("aot_unpaired"),
        "--label_smoothing {} changes none of the loss types {}: it is robust DPO's flip probability (--loss_type "
        "robust), EXO's epsilon (exo_pair) and aot's smoothing; TRL 1.16's sigmoid loss has no label smoothing "
        "(cDPO's smoothed sigmoid is --loss_type robust's numerator)", a.label_smoothing, a.loss_type);
  check(!uses("exo_pair") || a.label_smoothing > 0,
        "--loss_type exo_pair needs --label_smoothing above 0 (EXO's epsilon; its paper suggests 1e-3)");
  const auto& f = a.f_divergence_type;
  check(f == "reverse_kl" || f == "forward_kl" || f == "js_divergence" || f == "alpha_divergence",
        "--f_divergence_type '{}' is not one of reverse_kl, forward_kl, js_divergence, alpha_divergence", f);
  if (f != "reverse_kl") {
    for (const auto& t : spec.types)
      check(std::find(std::begin(f_divergence_loss_types), std::end(f_divergence_loss_types), t) !=
                std::end(f_divergence_loss_types),
            "--f_divergence_type {} applies to the losses sigmoid, sigmoid_norm, hinge, ipo, exo_pair, robust, "
            "discopop and sft only, not to '{}'", f, t);
  }
  check(!a.ld_alpha || (*a.ld_alpha >= 0 && *a.ld_alpha <= 1), "--ld_alpha must be in [0, 1], got {}",
        a.ld_alpha.value_or(0));
  check(!uses("discopop") || (std::isfinite(a.discopop_tau) && a.discopop_tau > 0),
        "--discopop_tau must be positive, got {}", a.discopop_tau);
  check(!a.precompute_ref_batch_size || *a.precompute_ref_batch_size > 0,
        "--precompute_ref_batch_size must be positive, got {}", a.precompute_ref_batch_size.value_or(0));
  check(!a.use_weighting, "--use_weighting (WPO) is not implemented by loom; leave it false");
  check(!a.sync_ref_model, "--sync_ref_model (TR-DPO) is not implemented by loom; leave it false");
  return spec;
}

/// What DPO's loss reads of a batch of pairs (each [pairs], float32).
struct DPOTerms {
  torch::Tensor chosen_logps, rejected_logps;          ///< the policy's completion log-probabilities
  torch::Tensor ref_chosen_logps, ref_rejected_logps;  ///< the reference's
  torch::Tensor chosen_lengths, rejected_lengths;      ///< completion tokens (ipo, sigmoid_norm)
  torch::Tensor chosen_token_logps;                    ///< the policy's chosen log-probability per position (sft)
  torch::Tensor chosen_token_mask;                     ///< where those positions are scored (sft)
};

/// TRL's f-divergence scores of the log-ratios (chosen or rejected).
inline torch::Tensor f_divergence_scores(const torch::Tensor& logratios, const DPOArguments& a) {
  const auto& f = a.f_divergence_type;
  if (f == "forward_kl") return 1 - torch::exp(-logratios);
  if (f == "js_divergence") return std::log(2.0) + torch::log_sigmoid(logratios);
  if (f == "alpha_divergence") {
    const double alpha = a.f_alpha_divergence_coef;
    if (std::abs(alpha - 1.0) < 1e-6) return logratios;
    const auto dtype = logratios.scalar_type();
    const double clamp_max = dtype == torch::kHalf ? 11.0 : 80.0;  // exp stays representable in the format
    const auto t = torch::clamp((alpha - 1.0) * logratios, std::nullopt, clamp_max);
    return (torch::exp(t.to(torch::kFloat)) - 1.0).to(dtype) * (1.0 / (alpha - 1.0));
  }
  return logratios;
}

/// DPO's loss of one batch: each loss type's per-pair loss averaged over the pairs, weighted
/// and summed (TRL's _compute_loss, term by term).
inline torch::Tensor dpo_loss(const DPOTerms& t, const DPOArguments& a, const DPOLossSpec& spec) {
  const double beta = a.beta, eps = a.label_smoothing;
  const auto chosen_logratios = t.chosen_logps - t.ref_chosen_logps;
  const auto rejected_logratios = t.rejected_logps - t.ref_rejected_logps;
  const auto chosen_scores = f_divergence_scores(chosen_logratios, a);
  const auto rejected_scores = f_divergence_scores(rejected_logratios, a);
  const auto delta = chosen_scores - rejected_scores;
  const auto smoothed_sigmoid = [&](const torch::Tensor& d) {
    return -torch::log_sigmoid(beta * d) * (1 - eps) - torch::log_sigmoid(-beta * d) * eps;
  };
  torch::Tensor loss;
  for (std::size_t k = 0; k < spec.types.size(); ++k) {
    const auto& type = spec.types[k];
    torch::Tensor per_pair;
    if (type == "sigmoid") {
      per_pair = -torch::log_sigmoid(beta * delta);
    } else if (type == "hinge") {
      per_pair = torch::relu(1 - beta * delta);
    } else if (type == "ipo") {
      // Per completion token (TRL's normalization, agreed with IPO's authors), then Eq. 17.
      const auto d = chosen_scores / t.chosen_lengths.clamp_min(1.0) - rejected_scores / t.rejected_lengths.clamp_min(1.0);
      per_pair = (d - 1 / (2 * beta)).pow(2);
    } else if (type == "exo_pair") {
      const auto epsilon = torch::tensor(eps, delta.options());
      per_pair = torch::sigmoid(beta * delta) * (torch::log_sigmoid(beta * delta) - torch::log1p(-epsilon)) +
                 torch::sigmoid(-beta * delta) * (torch::log_sigmoid(-beta * delta) - torch::log(epsilon));
    } else if (type == "nca_pair") {
      const auto chosen = beta * chosen_logratios, rejected = beta * rejected_logratios;
      per_pair = -torch::log_sigmoid(chosen) - 0.5 * torch::log_sigmoid(-chosen) - 0.5 * torch::log_sigmoid(-rejected);
    } else if (type == "robust") {
      const auto clean = -(1 - eps) * torch::log_sigmoid(beta * delta);
      const auto flipped = -eps * torch::log_sigmoid(-beta * delta);
      per_pair = (clean - flipped) / (1 - 2 * eps);
    } else if (type == "bco_pair") {
      per_pair = -torch::log_sigmoid(beta * chosen_logratios) - torch::log_sigmoid(-beta * rejected_logratios);
    } else if (type == "sppo_hard") {
      per_pair = (chosen_logratios - 0.5 / beta).pow(2) + (rejected_logratios + 0.5 / beta).pow(2);
    } else if (type == "aot") {
      const auto logratios = std::get<0>(torch::sort(t.chosen_logps - t.rejected_logps, 0));
      const auto ref_logratios = std::get<0>(torch::sort(t.ref_chosen_logps - t.ref_rejected_logps, 0));
      per_pair = smoothed_sigmoid(logratios - ref_logratios);
    } else if (type == "aot_unpaired") {
      per_pair = smoothed_sigmoid(std::get<0>(torch::sort(chosen_logratios, 0)) -
                                  std::get<0>(torch::sort(rejected_logratios, 0)));
    } else if (type == "apo_zero") {
      per_pair = (1 - torch::sigmoid(beta * chosen_logratios)) + torch::sigmoid(beta * rejected_logratios);
    } else if (type == "apo_down") {
      per_pair = torch::sigmoid(beta * chosen_logratios) +
                 (1 - torch::sigmoid(beta * (chosen_logratios - rejected_logratios)));
    } else if (type == "discopop") {
      const auto logits = delta * beta;
      const auto modulation = torch::sigmoid(logits / a.discopop_tau);
      per_pair = -torch::log_sigmoid(logits) * (1 - modulation) + torch::exp(-logits) * modulation;
    } else if (type == "sft") {
      per_pair = (-t.chosen_token_logps.masked_select(t.chosen_token_mask).mean()).expand({delta.size(0)});
    } else if (type == "sigmoid_norm") {
      const auto d = chosen_scores / t.chosen_lengths.clamp_min(1.0) - rejected_scores / t.rejected_lengths.clamp_min(1.0);
      per_pair = -torch::log_sigmoid(beta * d);
    } else {
      fail("DPO loss type '{}' is not implemented", type);
    }
    const auto term = per_pair.mean() * spec.weights[k];
    loss = loss.defined() ? loss + term : term;
  }
  return loss;
}

}  // namespace detail

}  // namespace loom::methods
