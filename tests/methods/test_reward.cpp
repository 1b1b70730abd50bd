// Reward modelling (loom/methods/reward.hpp) against TRL's RewardTrainer (tests/methods/
// trl_reward.py): the same tiny Llama reward model, pairs, flags and order give the same loss,
// gradient norm and TRL's metrics at every step, with and without the margin column and
// center_rewards_coefficient.

#include <loom/loom.hpp>
#include <loom/checkpoint/safetensors.hpp>
#include <loom/data/preference.hpp>
#include <loom/methods/reward.hpp>
#include <loom/models/llama.hpp>

#include <doctest/doctest.h>

#include "../models/peer_support.hpp"
#include "../support.hpp"
#include "../trainer_support.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <filesystem>
#include <string>
#include <vector>

namespace reward_test {

namespace fs = std::filesystem;
using RewardModel = loom::models::LlamaForSequenceClassification;

inline std::string script() { return (loom_test::source_dir() / "tests/methods/trl_reward.py").string(); }

// The reward model and pairs trl_reward.py makes, once per run (nullptr: no Python).
inline const fs::path* made() {
  return loom_test::peer_made("../methods/trl_reward.py", "trl_reward", "made reward", "the comparison with TRL");
}

// The pairs as loom's batch rows (margin only when asked).
inline loom::data::TensorDataset<loom::methods::PreferenceBatch> pairs(const fs::path& dir, bool margin) {
  loom::methods::PreferenceBatch b;
  for (auto& [name, t] : loom::checkpoint::load_safetensors(dir / "pairs.safetensors")) {
    if (name == "chosen_input_ids") b.chosen_input_ids = t;
    if (name == "chosen_attention_mask") b.chosen_attention_mask = t;
    if (name == "rejected_input_ids") b.rejected_input_ids = t;
    if (name == "rejected_attention_mask") b.rejected_attention_mask = t;
    if (name == "margin" && margin) b.margin = t;
  }
  return loom::data::TensorDataset<loom::methods::PreferenceBatch>(b);
}

const std::vector<std::string> kFlags{"--per_device_train_batch_size", "4", "--learning_rate", "5e-3",
                                      "--lr_scheduler_type", "linear", "--warmup_steps", "1", "--max_steps", "6",
                                      "--logging_steps", "1", "--save_strategy", "no", "--seed", "42",
                                      "--gradient_checkpointing", "false", "--max_grad_norm", "1.0", "--use_cpu",
                                      "true", "--disable_tqdm", "true", "--bf16", "false"};
// TRL's RewardConfig turns on --gradient_checkpointing and, where it can, --bf16 by default
// (base_config.py): both given here, float32 on both sides.

TEST_CASE("RewardTrainer: TRL's loss and metrics at every step, with a margin and centred rewards or without") {
  const fs::path* dir = made();
  if (dir == nullptr) return;
  for (const bool with_margin : {false, true}) {
    const std::string center = with_margin ? "0.01" : "none";
    CAPTURE(with_margin);
    const auto out = loom_test::fresh_dir(with_margin ? "methods/reward_margin" : "methods/reward_plain");
    std::string flags;
    for (const auto& f : kFlags) flags += " " + f;
    const auto trl = loom_test::run_capture(std::string(loom_test::python("")) + " " + script() + " train " +
                                            dir->string() + " " + (out / "trl").string() + " " +
                                            (with_margin ? "1" : "0") + " " + center + flags + " 2>&1");
    INFO(trl);
    REQUIRE(trl.find("trained reward") != std::string::npos);
    const auto expected = loom::json::read_file(out / "trl" / "log_history.json");

    std::vector<std::string> argv = kFlags;
    argv.insert(argv.end(), {"--output_dir", (out / "loom").string()});
    if (center != "none") argv.insert(argv.end(), {"--center_rewards_coefficient", center});
    auto [args, reward] =
        loom::try_parse_args<loom::TrainingArguments, loom::methods::RewardArguments>(argv).values;
    auto model = RewardModel::from_pretrained(*dir / "init");
    loom::methods::RewardTrainer<RewardModel> trainer(reward, args, model, pairs(*dir, with_margin));
    trainer.train();
    const auto& got = trainer.state().log_history;
    REQUIRE(expected.size() == got.size());  // 6 steps and the run's summary
    int compared = 0;
    double worst = 0;
    for (std::size_t i = 0; i + 1 < got.size(); ++i) {
      INFO("TRL: " << expected[i].dump() << "\nloom: " << got[i].dump());
      for (const std::string key : {"loss", "grad_norm", "learning_rate", "min_reward", "mean_reward", "max_reward",
                              "accuracy", "margin", "num_tokens"}) {
        CAPTURE(i);
        CAPTURE(key);
        REQUIRE(expected[i].contains(key));
        REQUIRE(got[i].contains(key));
        const double want = expected[i][key].get<double>(), have = got[i][key].get<double>();
        CHECK(std::abs(have - want) <= 1e-6 * std::max(1.0, std::abs(want)));
        worst = std::max(worst, std::abs(have - want) / std::max(1.0, std::abs(want)));
        ++compared;
      }
    }
    CHECK(compared == 6 * 9);
    MESSAGE("largest difference from TRL (relative above 1, absolute below): " << worst);
    // The model learned: the loss fell.
    CHECK(got[5]["loss"].get<double>() < got[0]["loss"].get<double>());
  }
}

TEST_CASE("RewardTrainer refuses a model with more than one output and a config without pad_token_id") {
  const fs::path* dir = made();
  if (dir == nullptr) return;
  auto args = loom_test::quiet_args("methods/reward_refusals");
  args.max_steps = 1;
  auto config = loom::models::read_hf_config<loom::models::LlamaConfig>(*dir / "init");
  config.num_labels = 3, config.id2label.clear(), config.label2id.clear();
  RewardModel three(config);
  loom::methods::RewardTrainer<RewardModel> wrong(loom::methods::RewardArguments{}, args, three, pairs(*dir, false));
  const auto error = loom_test::error_of([&] { wrong.train(); });
  CHECK(error.starts_with("loom: RewardTrainer: the model must give one reward per row (num_labels 1)"));
  // A config without pad_token_id: the pairs cannot be padded to one batch.
  const auto unpadded = loom_test::fresh_dir("methods/reward_no_pad");
  fs::copy(*dir / "init", unpadded, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  auto json = loom::json::read_file(unpadded / "config.json");
  json.erase("pad_token_id");
  loom_test::write_bytes(unpadded / "config.json", json.dump());
  auto no_pad = RewardModel::from_pretrained(unpadded);
  loom::methods::RewardTrainer<RewardModel> refused(loom::methods::RewardArguments{}, args, no_pad, pairs(*dir, false));
  CHECK(loom_test::error_of([&] { refused.train(); }).starts_with("loom: RewardTrainer: the model's config has no "
                                                                  "pad_token_id"));
}

TEST_CASE("prepare.py --preference's files as PreferenceBatch rows: sides, masks, labels, margins; a reward model trains") {
  const char* py = loom_test::python("prepare.py --preference");
  if (py == nullptr) return;
  const auto dir = loom_test::fresh_dir("methods/preference_data");
  std::string lines;
  std::vector<float> margins;
  for (int i = 0; i < 12; ++i) {
    const float margin = 0.25f * static_cast<float>(i);
    margins.push_back(margin);
    lines += fmt::format(R"({{"prompt": "question {} about the light", "chosen": "a good answer {}", )"
                         R"("rejected": "no", "margin": {}}})" "\n", i, i, margin);
  }
  loom_test::write_bytes(dir / "pairs.jsonl", lines);
  const auto out = loom_test::run_capture(std::string(py) + " " +
                                          (loom_test::source_dir() / "examples/text_data/prepare.py").string() +
                                          " --preference " + (dir / "pairs.jsonl").string() + " --out " +
                                          (dir / "data").string() + " --vocab_size 300 --val_fraction 0 2>&1");
  INFO(out);
  REQUIRE(out.find("preference train 12 pairs") != std::string::npos);
  const auto meta = loom::data::read_token_meta(dir / "data" / "meta.json");
  loom::data::PreferenceDataset pairs(meta.preference_files("train"),
                                      {.dtype = meta.dtype, .vocab_size = meta.vocab_size,
                                       .pad_token_id = meta.pad_token_id.value_or(0), .max_length = std::nullopt,
                                       .packing = std::nullopt});
  REQUIRE(pairs.size() == 12);
  CHECK(pairs.has_margin());
  std::vector<int64_t> all(12);
  for (int64_t i = 0; i < 12; ++i) all[static_cast<std::size_t>(i)] = i;
  const auto b = pairs.get_batch(all);
  for (const auto& [ids, mask, labels] : {std::tuple{b.chosen_input_ids, b.chosen_attention_mask, b.chosen_labels},
                                          std::tuple{b.rejected_input_ids, b.rejected_attention_mask, b.rejected_labels}}) {
    REQUIRE(ids.sizes() == mask.sizes());
    REQUIRE(ids.sizes() == labels.sizes());
    // Labels: the completion's ids under the mask, -100 on the prompt and the padding.
    const auto scored = labels.ne(-100);
    CHECK(torch::equal(labels.masked_select(scored), ids.masked_select(scored)));
    CHECK(mask.masked_select(scored).eq(1).all().item<bool>());
    CHECK(ids.masked_select(mask.eq(0)).eq(meta.pad_token_id.value_or(0)).all().item<bool>());
    CHECK(scored.sum(1).gt(0).all().item<bool>());  // every side has a completion
  }
  // The chosen answer is longer than "no": its completion scores more tokens, pair by pair.
  CHECK(b.chosen_labels.ne(-100).sum(1).gt(b.rejected_labels.ne(-100).sum(1)).all().item<bool>());
  std::vector<float> seen(b.margin.data_ptr<float>(), b.margin.data_ptr<float>() + 12);
  std::sort(seen.begin(), seen.end());
  CHECK(seen == margins);

  // A reward model on them: two steps, the loss finite.
  loom::models::LlamaConfig c;
  c.vocab_size = meta.vocab_size, c.hidden_size = 32, c.intermediate_size = 64, c.num_hidden_layers = 1;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = 64;
  c.pad_token_id = meta.pad_token_id, c.num_labels = 1;
  torch::manual_seed(0);
  RewardModel model(c);
  auto args = loom_test::quiet_args("methods/preference_reward");
  args.max_steps = 2, args.per_device_train_batch_size = 4, args.logging_steps = 1;
  loom::methods::RewardTrainer<RewardModel> trainer(loom::methods::RewardArguments{}, args, model, std::move(pairs));
  trainer.train();
  CHECK(std::isfinite(trainer.state().log_history.at(1)["loss"].get<double>()));
  CHECK(trainer.state().log_history.at(1).contains("accuracy"));
}

}  // namespace reward_test
