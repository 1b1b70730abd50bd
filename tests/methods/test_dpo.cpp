// DPO (loom/methods/dpo.hpp) against TRL's DPOTrainer (tests/methods/trl_dpo.py): the same tiny
// Llama, pairs, flags and order give the same loss, gradient norm and TRL's metrics at every
// step, for each of trl_dpo.py's cases (loss types, f-divergence, LD-DPO, the reference as a
// frozen copy, precomputed, or the LoRA base with the adapter off); and the refusals.

#include <loom/loom.hpp>
#include <loom/checkpoint/safetensors.hpp>
#include <loom/data/preference.hpp>
#include <loom/methods/dpo.hpp>
#include <loom/models/llama.hpp>
#include <loom/peft/lora.hpp>

#include <doctest/doctest.h>

#include "../models/peer_support.hpp"
#include "../support.hpp"
#include "../trainer_support.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

namespace dpo_test {

namespace fs = std::filesystem;
using LM = loom::models::LlamaForCausalLM;
using Pairs = loom::data::TensorDataset<loom::data::PreferenceBatch>;

inline std::string script() { return (loom_test::source_dir() / "tests/methods/trl_dpo.py").string(); }

// The model, pairs and cases trl_dpo.py makes, once per run (nullptr: no Python).
inline const fs::path* made() {
  return loom_test::peer_made("../methods/trl_dpo.py", "trl_dpo", "made dpo", "the comparison with TRL");
}

// TRL's runs of every case, once per run: the folder of their logs.
inline fs::path trl_runs(const fs::path& dir) {
  static std::optional<fs::path> out;
  if (!out) {
    const auto where = loom_test::fresh_dir("methods/dpo_trl");
    const auto log = loom_test::run_capture(std::string(loom_test::python("")) + " " + script() + " train " +
                                            dir.string() + " " + where.string() + " 2>&1");
    INFO(log);
    REQUIRE(log.find("trained dpo") != std::string::npos);
    out = where;
  }
  return *out;
}

inline Pairs pairs(const fs::path& dir) {
  loom::data::PreferenceBatch b;
  for (auto& [name, t] : loom::checkpoint::load_safetensors(dir / "pairs.safetensors")) {
    if (name == "chosen_input_ids") b.chosen_input_ids = t;
    if (name == "chosen_attention_mask") b.chosen_attention_mask = t;
    if (name == "chosen_labels") b.chosen_labels = t;
    if (name == "rejected_input_ids") b.rejected_input_ids = t;
    if (name == "rejected_attention_mask") b.rejected_attention_mask = t;
    if (name == "rejected_labels") b.rejected_labels = t;
  }
  return Pairs(b);
}

// A case's DPOConfig fields as loom's flags (lists comma-separated).
inline std::vector<std::string> dpo_flags(const nlohmann::json& fields) {
  std::vector<std::string> flags;
  for (const auto& [key, value] : fields.items()) {
    std::string text;
    if (value.is_array()) {
      for (const auto& v : value) text += (text.empty() ? "" : ",") + (v.is_string() ? v.get<std::string>() : v.dump());
    } else if (value.is_string()) {
      text = value.get<std::string>();
    } else {
      text = value.dump();
    }
    flags.insert(flags.end(), {"--" + key, text});
  }
  return flags;
}

const char* const kCompared[] = {"loss",          "grad_norm",        "learning_rate",     "entropy",
                                 "num_tokens",    "logits/chosen",    "logits/rejected",   "mean_token_accuracy",
                                 "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
                                 "logps/chosen",  "logps/rejected"};

TEST_CASE("DPOTrainer: TRL's loss and metrics at every step, for each loss, divergence and reference") {
  const fs::path* dir = made();
  if (dir == nullptr) return;
  const auto trl = trl_runs(*dir);
  const auto spec = loom::json::read_file(*dir / "cases.json");
  int cases = 0;
  for (const auto& [name, c] : spec["cases"].items()) {
    CAPTURE(name);
    const auto expected = loom::json::read_file(trl / name / "log_history.json");
    std::vector<std::string> argv = spec["flags"].get<std::vector<std::string>>();
    const auto out = loom_test::fresh_dir("methods/dpo_" + name);
    argv.insert(argv.end(), {"--output_dir", out.string()});
    for (const auto& f : dpo_flags(c["dpo"])) argv.push_back(f);
    auto [args, dpo] = loom::try_parse_args<loom::TrainingArguments, loom::methods::DPOArguments>(argv).values;
    auto model = LM::from_pretrained(*dir / "init");
    if (c["lora"].get<bool>()) loom::peft::load_adapter(*model, trl / name / "init_adapter");
    loom::methods::DPOTrainer<LM> trainer(dpo, args, model, pairs(*dir), pairs(*dir));
    trainer.train();
    const auto& got = trainer.state().log_history;
    REQUIRE(expected.size() == got.size());  // 6 steps and the run's summary
    const double tolerance = c.value("tolerance", 1e-6);
    double worst = 0;
    int compared = 0;
    for (std::size_t i = 0; i + 1 < got.size(); ++i) {
      INFO("TRL: " << expected[i].dump() << "\nloom: " << got[i].dump());
      for (const std::string key : kCompared) {
        CAPTURE(i);
        CAPTURE(key);
        REQUIRE(expected[i].contains(key));
        REQUIRE(got[i].contains(key));
        const double want = expected[i][key].get<double>(), have = got[i][key].get<double>();
        CHECK(std::abs(have - want) <= tolerance * std::max(1.0, std::abs(want)));
        worst = std::max(worst, std::abs(have - want) / std::max(1.0, std::abs(want)));
        ++compared;
      }
    }
    CHECK(compared == 6 * 14);
    MESSAGE(name << ": largest difference from TRL (relative above 1, absolute below): " << worst);
    if (c.value("evaluate", false)) {
      // TRL's evaluation of the trained policy: eval_loss and the metrics with eval_.
      const auto want = loom::json::read_file(trl / name / "eval.json");
      const auto have = trainer.evaluate();
      int seen = 0;
      for (const auto& [key, value] : want.items()) {
        if (key.ends_with("_runtime") || key.ends_with("_per_second") || key == "epoch") continue;
        CAPTURE(key);
        REQUIRE(have.get(key).has_value());
        CHECK(std::abs(*have.get(key) - value.get<double>()) <= tolerance * std::max(1.0, std::abs(value.get<double>())));
        ++seen;
      }
      CHECK(seen == 12);  // eval_loss and eleven metrics (num_tokens among them)
    }
    // The policy starts as the reference: the sigmoid loss is ln 2 exactly.
    if (!c["dpo"].contains("loss_type")) CHECK(got[0]["loss"].get<double>() == doctest::Approx(std::log(2.0)).epsilon(1e-7));
    ++cases;
  }
  CHECK(cases == 8);
}

TEST_CASE("DPOTrainer refuses bad arguments at start-up, each naming its flag") {
  const fs::path* dir = made();
  if (dir == nullptr) return;
  const auto refused = [&](std::vector<std::string> flags) {
    flags.insert(flags.end(), {"--output_dir", loom_test::fresh_dir("methods/dpo_refused").string(), "--max_steps", "1"});
    return loom_test::error_of([&] {
      auto [args, dpo] = loom::try_parse_args<loom::TrainingArguments, loom::methods::DPOArguments>(flags).values;
      auto model = LM::from_pretrained(*dir / "init");
      loom::methods::DPOTrainer<LM> trainer(dpo, args, model, pairs(*dir));
    });
  };
  CHECK(refused({"--loss_type", "sigmoid,kto"}).starts_with("loom: --loss_type 'kto' is not a DPO loss"));
  CHECK(refused({"--loss_type", "sigmoid,ipo", "--loss_weights", "1"}).starts_with("loom: --loss_weights has 1 weights for 2"));
  CHECK(refused({"--loss_weights", "x"}).starts_with("loom: --loss_weights: 'x' is not a number"));
  CHECK(refused({"--beta", "0"}).starts_with("loom: --beta must be positive"));
  CHECK(refused({"--loss_type", "robust", "--label_smoothing", "0.5"}).starts_with("loom: --label_smoothing 0.5 with --loss_type robust"));
  CHECK(refused({"--loss_type", "exo_pair"}).starts_with("loom: --loss_type exo_pair needs --label_smoothing"));
  CHECK(refused({"--label_smoothing", "0.1"}).starts_with("loom: --label_smoothing 0.1 changes none of the loss types sigmoid"));
  CHECK(refused({"--f_divergence_type", "kl"}).starts_with("loom: --f_divergence_type 'kl' is not one of"));
  CHECK(refused({"--f_divergence_type", "forward_kl", "--loss_type", "bco_pair"})
            .starts_with("loom: --f_divergence_type forward_kl applies to the losses"));
  CHECK(refused({"--ld_alpha", "2"}).starts_with("loom: --ld_alpha must be in [0, 1]"));
  CHECK(refused({"--use_weighting", "true"}).starts_with("loom: --use_weighting (WPO) is not implemented by loom"));
  CHECK(refused({"--sync_ref_model", "true"}).starts_with("loom: --sync_ref_model (TR-DPO) is not implemented by loom"));
  // Pairs without labels: nothing says which tokens are the completion.
  auto args = loom_test::quiet_args("methods/dpo_no_labels");
  args.max_steps = 1;
  auto unlabelled = pairs(*dir).tensors();
  unlabelled.chosen_labels = unlabelled.rejected_labels = torch::Tensor();
  auto model = LM::from_pretrained(*dir / "init");
  loom::methods::DPOTrainer<LM> trainer(loom::methods::DPOArguments{}, args, model, Pairs(unlabelled));
  CHECK(loom_test::error_of([&] { trainer.train(); }).starts_with("loom: DPOTrainer: the pairs have no chosen_labels"));
}

TEST_CASE("DPOTrainer's references agree: a frozen copy, a given model, precomputed, and the LoRA base") {
  const fs::path* dir = made();
  if (dir == nullptr) return;
  // Two steps of each; the policy moves in the second, so the losses differ from ln 2 there.
  const auto run = [&](const std::string& name, auto&& make) {
    auto args = loom_test::quiet_args("methods/dpo_ref_" + name);
    args.max_steps = 2, args.per_device_train_batch_size = 4, args.logging_steps = 1, args.learning_rate = 5e-3;
    return make(args);
  };
  const auto losses = [](const auto& trainer) {
    const auto& h = trainer.state().log_history;
    return std::vector<double>{h.at(0)["loss"].template get<double>(), h.at(1)["loss"].template get<double>()};
  };
  const auto copy = run("copy", [&](auto args) {
    auto model = LM::from_pretrained(*dir / "init");
    loom::methods::DPOTrainer<LM> t(loom::methods::DPOArguments{}, args, model, pairs(*dir));
    t.train();
    return losses(t);
  });
  const auto given = run("given", [&](auto args) {
    auto model = LM::from_pretrained(*dir / "init");
    loom::methods::DPOTrainer<LM> t(loom::methods::DPOArguments{}, {LM::from_pretrained(*dir / "init")}, args, model,
                                    pairs(*dir));
    t.train();
    return losses(t);
  });
  const auto precomputed = run("precomputed", [&](auto args) {
    auto model = LM::from_pretrained(*dir / "init");
    loom::methods::DPOArguments dpo;
    dpo.precompute_ref_log_probs = true;
    loom::methods::DPOTrainer<LM> t(dpo, args, model, pairs(*dir));
    t.train();
    return losses(t);
  });
  CHECK(copy[0] == std::log(2.0f));
  CHECK(copy[1] != copy[0]);
  CHECK(given == copy);
  CHECK(precomputed[0] == doctest::Approx(copy[0]).epsilon(1e-6));
  CHECK(precomputed[1] == doctest::Approx(copy[1]).epsilon(1e-6));
  // A LoRA adapter that trains whole modules is refused as its own reference.
  auto model = LM::from_pretrained(*dir / "init");
  loom::peft::LoraConfig lora;
  lora.r = 2, lora.target_modules = {"q_proj"}, lora.modules_to_save = {"lm_head"};
  loom::peft::apply_lora(*model, lora);
  auto args = loom_test::quiet_args("methods/dpo_ref_lora_saved");
  CHECK(loom_test::error_of([&] {
          loom::methods::DPOTrainer<LM> t(loom::methods::DPOArguments{}, args, model, pairs(*dir));
        }).starts_with("loom: DPOTrainer: the policy's LoRA adapter trains whole modules"));
}

}  // namespace dpo_test
