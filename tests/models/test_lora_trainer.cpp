// LoRA in the Trainer (loom/peft/lora.hpp): a Llama-architecture model whose base is frozen
// trains its adapter alone; checkpoints hold PEFT's adapter files and never the base; a resumed
// run ends bitwise where the uninterrupted one does; PEFT opens save_model's folder onto the
// base transformers reads, and transformers opens the merged folder. Also: save_model and every
// checkpoint-N of a full fine-tune hold config.json and the tokenizer files, so transformers'
// from_pretrained opens them. And --predict_with_generate: evaluation hands compute_metrics each
// row's completion generated from its prompt (models/generation.hpp's generate, which
// tests/models/test_generate.cpp checks against transformers) and the reference completions.

#include <loom/loom.hpp>
#include <loom/models/generation.hpp>
#include <loom/models/llama.hpp>

#include <doctest/doctest.h>

#include "../support.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace lora_trainer_test {

namespace fs = std::filesystem;
using loom::data::CausalLMBatch;
using loom::models::LlamaForCausalLM;
using Trainer = loom::DefaultTrainer<LlamaForCausalLM>;

inline std::string script() { return (loom_test::source_dir() / "tests/models/hf_llama.py").string(); }

inline loom::models::LlamaConfig tiny() {
  loom::models::LlamaConfig c;
  c.vocab_size = 100, c.hidden_size = 48, c.intermediate_size = 96, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = 64;
  c.bos_token_id = 0, c.eos_token_id = 1;
  return c;
}

// A random base model saved once per run (the folder every test starts from).
inline const fs::path& base_folder() {
  static const fs::path dir = [] {
    torch::manual_seed(5);
    const auto d = loom_test::fresh_dir("models/lora_trainer_base");
    LlamaForCausalLM(tiny())->save_pretrained(d);
    return d;
  }();
  return dir;
}

// Windows of 16 random tokens (own generator): the model learns to continue them.
inline loom::data::TensorDataset<CausalLMBatch> windows(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto ids = torch::randint(2, 100, {n, 16}, gen);
  return loom::data::TensorDataset<CausalLMBatch>({ids, ids.clone()});
}

inline loom::peft::LoraConfig lora_config() {
  loom::peft::LoraConfig c;
  c.r = 4, c.lora_alpha = 8, c.target_modules = {"q_proj", "v_proj"}, c.modules_to_save = {"lm_head"};
  return c;
}

// The base read from its folder, with the adapter on (A drawn from the seeded generator).
inline LlamaForCausalLM adapted() {
  auto model = LlamaForCausalLM::from_pretrained(base_folder());
  torch::manual_seed(11);
  CHECK(loom::peft::apply_lora(*model, lora_config()) == 4);
  return model;
}

inline loom::TrainingArguments args_for(const std::string& name, int64_t max_steps) {
  loom::TrainingArguments a;
  a.output_dir = loom_test::tmp_dir(name).string();
  a.disable_tqdm = true;
  a.use_cpu = true;
  a.max_steps = max_steps;
  a.per_device_train_batch_size = 4;
  a.learning_rate = 5e-3;
  a.lr_scheduler_type = "cosine";
  a.warmup_steps = 1;
  a.logging_steps = 1;
  a.save_strategy = "steps";
  a.save_steps = 3;
  a.seed = 7;
  return a;
}

inline std::map<std::string, torch::Tensor> state_of(const torch::nn::Module& m) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

inline std::set<std::string> files_in(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

TEST_CASE("LoRA in the Trainer: the base stays, checkpoints hold the adapter alone, resume is bitwise") {
  auto model = adapted();
  const auto before = state_of(*model);
  const auto data = windows(48, 3);
  const auto args = args_for("lora_trainer/full", 6);
  Trainer trainer(args, model, data);
  trainer.train();
  const auto after = state_of(*model);
  int changed = 0, trainable = 0;
  for (const auto& [name, t] : after) {
    const bool adapter = name.find(".lora_") != std::string::npos || name.rfind("lm_head.", 0) == 0;
    CAPTURE(name);
    if (adapter) {
      ++trainable;
      changed += torch::equal(t, before.at(name)) ? 0 : 1;
    } else {
      CHECK(torch::equal(t, before.at(name)));  // the frozen base, bitwise
    }
  }
  CHECK(trainable == 2 * 2 * 2 + 1);  // lora_A and lora_B of q_proj and v_proj in 2 layers, lm_head
  CHECK(changed == trainable);

  // checkpoint-3: PEFT's adapter files, the optimizer state of the trainable tensors only, no base.
  const fs::path ckpt = fs::path(trainer.args().output_dir) / "checkpoint-3";
  const auto files = files_in(ckpt);
  CHECK(files.contains("adapter_model.safetensors"));
  CHECK(files.contains("adapter_config.json"));
  CHECK_FALSE(files.contains("model.safetensors"));
  CHECK_FALSE(files.contains("config.json"));
  std::set<std::string> keys;
  for (const auto& [k, t] : loom::checkpoint::load_safetensors(ckpt / "adapter_model.safetensors")) keys.insert(k);
  CHECK(keys.size() == 9);
  CHECK(keys.contains("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"));
  CHECK(keys.contains("base_model.model.lm_head.weight"));
  const auto config = loom::json::read_file(ckpt / "adapter_config.json");
  CHECK(config["r"] == 4);
  CHECK(config["modules_to_save"] == nlohmann::json::array({"lm_head"}));
  std::set<std::string> stepped;
  for (const auto& [k, t] : loom::checkpoint::load_safetensors(ckpt / "optimizer.safetensors"))
    stepped.insert(k.substr(k.find('.') + 1));
  CHECK(stepped.size() == 9);
  for (const auto& param : stepped) {
    CAPTURE(param);
    CHECK((param.find(".lora_") != std::string::npos || param == "lm_head.weight"));
  }

  // Stopped after checkpoint-3 and resumed there (from a fresh base and adapter): bitwise.
  auto resumed_model = adapted();
  auto resume_args = args;
  resume_args.resume_from_checkpoint = ckpt.string();
  Trainer resumed(resume_args, resumed_model, data);
  resumed.train();
  for (const auto& [name, t] : state_of(*resumed_model)) {
    CAPTURE(name);
    CHECK(torch::equal(t, after.at(name)));
  }

  // A checkpoint of another adapter (another alpha) is refused with what differs.
  auto other = LlamaForCausalLM::from_pretrained(base_folder());
  auto other_config = lora_config();
  other_config.lora_alpha = 16;
  loom::peft::apply_lora(*other, other_config);
  Trainer mismatched(resume_args, other, data);
  const auto error = loom_test::error_of([&] { mismatched.train(); });
  CHECK(error.starts_with("loom: "));
  CHECK(error.find("the adapter was trained with lora_alpha 8, r 4") != std::string::npos);
  // A full model's checkpoint cannot resume an adapter, and an adapter's not a plain model.
  auto plain = LlamaForCausalLM::from_pretrained(base_folder());
  Trainer plain_trainer(resume_args, plain, data);
  CHECK(loom_test::error_of([&] { plain_trainer.train(); }).find("holds a LoRA adapter (adapter_model.safetensors), "
                                                                 "but the model carries none") != std::string::npos);
}

TEST_CASE("save_model of a LoRA run is PEFT's adapter folder; save_merged_model a folder transformers opens") {
  auto model = adapted();
  const auto data = windows(32, 4);
  auto args = args_for("lora_trainer/save", 4);
  args.save_strategy = "no";
  Trainer trainer(args, model, data);
  trainer.train();
  const fs::path out(trainer.args().output_dir);
  trainer.save_model();
  trainer.save_merged_model();
  CHECK(files_in(out).contains("adapter_model.safetensors"));
  CHECK_FALSE(files_in(out).contains("model.safetensors"));
  const auto merged = files_in(out / "merged");
  CHECK(merged.contains("model.safetensors"));
  CHECK(merged.contains("config.json"));
  // The model keeps its adapter (save_merged_model restores the base bitwise).
  const auto base = LlamaForCausalLM::from_pretrained(base_folder());
  CHECK(torch::equal(model->named_parameters()["model.layers.0.self_attn.q_proj.weight"],
                     base->named_parameters()["model.layers.0.self_attn.q_proj.weight"]));
  CHECK(model->named_parameters().contains("model.layers.0.self_attn.q_proj.lora_A.weight"));

  // The adapted model's logits; PEFT on transformers' copy of the base gives them, and
  // transformers gives them from the merged folder.
  model->eval();
  torch::NoGradGuard no_grad;
  const auto ids = windows(2, 9).get_batch(std::vector<int64_t>{0, 1}).input_ids;
  const auto logits = model->logits(ids).contiguous();
  const auto labels = ids.clone();
  const auto loss = model->forward({ids, labels}).loss.reshape({1});
  loom::checkpoint::save_safetensors({{"input_ids", ids}, {"labels", labels}, {"loom_logits", logits},
                                      {"merged_logits", logits}, {"merged_loss", loss}},
                                     out / "expected.safetensors");
  const char* py = loom_test::python("PEFT's and transformers' reading of the saved folders");
  if (py == nullptr) return;
  const auto peft_out = loom_test::run_capture(std::string(py) + " " + script() + " lora_check " + base_folder().string() +
                                               " " + out.string() + " " + (out / "expected.safetensors").string() +
                                               " 2>&1; echo \"exit=$?\"");
  INFO(peft_out);
  CHECK(peft_out.find("exit=0") != std::string::npos);
  const auto merged_out = loom_test::run_capture(std::string(py) + " " + script() + " check merged," +
                                                 (out / "merged").string() + "," + (out / "expected.safetensors").string() +
                                                 " 2>&1; echo \"exit=$?\"");
  INFO(merged_out);
  CHECK(merged_out.find("exit=0") != std::string::npos);
}

TEST_CASE("save_model and every checkpoint-N of a full fine-tune hold config.json and the tokenizer files") {
  auto model = LlamaForCausalLM::from_pretrained(base_folder());
  const auto data = windows(24, 5);
  auto args = args_for("lora_trainer/config_json", 3);
  Trainer trainer(args, model, data);
  const fs::path out(trainer.args().output_dir);
  const auto tokenizer = loom_test::fresh_dir("lora_trainer/tokenizer") / "tokenizer.json";
  std::ofstream(tokenizer) << R"({"version": "1.0"})";
  trainer.set_tokenizer_files({tokenizer});
  trainer.train();
  trainer.save_model();
  for (const auto& dir : {out, out / "checkpoint-3"}) {
    CAPTURE(dir);
    const auto files = files_in(dir);
    CHECK(files.contains("model.safetensors"));
    CHECK(files.contains("tokenizer.json"));
    REQUIRE(files.contains("config.json"));
    const auto config = loom::json::read_file(dir / "config.json");
    CHECK(config["model_type"] == "llama");
    CHECK(config["architectures"] == nlohmann::json::array({"LlamaForCausalLM"}));
    CHECK(config["hidden_size"] == 48);
    CHECK(config["use_cache"] == false);  // HF's Trainer writes args.use_cache (false by default) into the model's config
  }
  // transformers opens checkpoint-3 as the model it is (logits of the trained weights).
  auto reread = LlamaForCausalLM::from_pretrained(out / "checkpoint-3");
  reread->eval();
  torch::NoGradGuard no_grad;
  const auto ids = windows(2, 9).get_batch(std::vector<int64_t>{0, 1}).input_ids;
  const auto logits = reread->logits(ids).contiguous();
  const auto loss = reread->forward({ids, ids}).loss.reshape({1});
  loom::checkpoint::save_safetensors({{"input_ids", ids}, {"labels", ids}, {"llama_logits", logits}, {"llama_loss", loss}},
                                     out / "expected.safetensors");
  const char* py = loom_test::python("transformers' reading of checkpoint-N");
  if (py == nullptr) return;
  const auto opened = loom_test::run_capture(std::string(py) + " " + script() + " check llama," +
                                             (out / "checkpoint-3").string() + "," + (out / "expected.safetensors").string() +
                                             " 2>&1; echo \"exit=$?\"");
  INFO(opened);
  CHECK(opened.find("exit=0") != std::string::npos);
}

// A Trainer that keeps what compute_metrics received.
struct GenerateTrainer : loom::Trainer<GenerateTrainer, LlamaForCausalLM> {
  using loom::Trainer<GenerateTrainer, LlamaForCausalLM>::Trainer;
  std::vector<loom::EvalPrediction> seen;
  loom::Metrics compute_metrics(const loom::EvalPrediction& p) {
    seen.push_back(p);
    return {{"exact_match", loom::metrics::sequence_exact_match(p.predictions, p.label_ids)}};
  }
};

TEST_CASE("--predict_with_generate: compute_metrics gets each row's completion generated from its prompt") {
  auto model = LlamaForCausalLM::from_pretrained(base_folder());
  // Rows of prompt (labels -100) + completion, right-padded with 2 (labels -100): prompts of 3,
  // 5 and 2 tokens, completions of 4, 2 and 3.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(21);
  auto ids = torch::randint(3, 100, {3, 8}, gen);
  auto labels = torch::full({3, 8}, -100, torch::kLong);
  const std::vector<std::pair<int64_t, int64_t>> parts{{3, 4}, {5, 2}, {2, 3}};
  for (int64_t r = 0; r < 3; ++r) {
    const auto [p, c] = parts[static_cast<std::size_t>(r)];
    labels[r].narrow(0, p, c).copy_(ids[r].narrow(0, p, c));
    ids[r].narrow(0, p + c, 8 - p - c).fill_(2);
  }
  const loom::data::TensorDataset<CausalLMBatch> eval({ids, labels});
  auto args = args_for("lora_trainer/generate", 1);
  args.predict_with_generate = true;
  args.per_device_eval_batch_size = 3;
  GenerateTrainer trainer(args, model, eval, eval);
  const auto metrics = trainer.evaluate();
  REQUIRE(trainer.seen.size() == 1);
  const auto& p = trainer.seen.front();
  CHECK(metrics.contains("eval_loss"));  // the loss is computed as without generation
  CHECK(metrics.get("eval_exact_match") == loom::metrics::sequence_exact_match(p.predictions, p.label_ids));
  // The references: each row's completion, -100 after it.
  REQUIRE(p.label_ids.sizes() == torch::IntArrayRef{3, 4});
  // The predictions: generate() on each prompt alone, as many new tokens as the longest completion.
  for (int64_t r = 0; r < 3; ++r) {
    CAPTURE(r);
    const auto [n_prompt, n_completion] = parts[static_cast<std::size_t>(r)];
    CHECK(torch::equal(p.label_ids[r].narrow(0, 0, n_completion), ids[r].narrow(0, n_prompt, n_completion)));
    CHECK(p.label_ids[r].narrow(0, n_completion, 4 - n_completion).eq(-100).all().item<bool>());
    // (a row that produced the eos id 1 goes on with the pad id, here the eos id as well)
    const auto alone = loom::models::generate(model, ids[r].narrow(0, 0, n_prompt).unsqueeze(0), {},
                                              {.max_new_tokens = 4});
    auto expected = torch::full({4}, 1, torch::kLong);
    expected.narrow(0, 0, alone.size(1) - n_prompt).copy_(alone[0].narrow(0, n_prompt, alone.size(1) - n_prompt));
    CHECK(torch::equal(p.predictions[r], expected));
  }
  // A prompt-less row and packed rows are refused; a generation_max_length within the prompts too.
  const auto no_prompt = loom::data::TensorDataset<CausalLMBatch>({ids, ids.clone()});
  CHECK(loom_test::error_of([&] { (void)trainer.evaluate(no_prompt); })
            .find("row 0 of the batch is labelled from its first token, so it has no prompt") != std::string::npos);
  args.generation_max_length = 5;
  GenerateTrainer short_trainer(args, model, eval, eval);
  CHECK(loom_test::error_of([&] { (void)short_trainer.evaluate(); }) ==
        "loom: --generation_max_length 5 leaves no new token after this batch's prompts of 5 tokens (left-padded to "
        "the longest); max_length counts the prompt and the new tokens");
}

TEST_CASE("LoraArguments: TRL's flags and defaults, PEFT's default targets, one loom: line per mistake") {
  loom::peft::LoraArguments a;
  CHECK_FALSE(loom::peft::lora_config_from_args(a, "llama").has_value());
  a.use_peft = true;
  auto c = loom::peft::lora_config_from_args(a, "llama");
  REQUIRE(c.has_value());
  CHECK(c->r == 16);
  CHECK(c->lora_alpha == 32);
  CHECK(c->lora_dropout == 0.05);
  CHECK(c->target_modules == std::vector<std::string>{"q_proj", "v_proj"});
  CHECK(loom::peft::lora_config_from_args(a, "gpt2")->target_modules == std::vector<std::string>{"c_attn"});
  a.lora_target_modules = "all-linear";
  a.lora_modules_to_save = "lm_head";
  auto model = LlamaForCausalLM::from_pretrained(base_folder());
  const auto applied = loom::peft::prepare_lora(*model, a, "llama");
  REQUIRE(applied.has_value());
  const auto carried = loom::peft::adapter_config(*model);
  REQUIRE(carried.has_value());
  CHECK(carried->target_modules.size() == 14);  // all-linear: every projection by name, as PEFT writes it
  CHECK(carried->target_modules.front() == "model.layers.0.self_attn.q_proj");

  const auto error = [](loom::peft::LoraArguments args, std::string_view type = "llama") {
    return loom_test::error_of([&] { (void)loom::peft::lora_config_from_args(args, type); });
  };
  loom::peft::LoraArguments bad;
  bad.lora_r = 8;
  CHECK(error(bad) == "loom: --lora_* flags are given without --use_peft; add --use_peft to train a LoRA adapter");
  loom::peft::LoraArguments merged_alone;
  merged_alone.lora_save_merged = true;
  CHECK(error(merged_alone).starts_with("loom: --lora_save_merged merges a LoRA adapter, and without --use_peft"));
  // PEFT's task types loom implements; an unknown or empty one, or one whose heads loom does not add, is refused.
  for (const char* task : {"", "CAUSAL", "TOKEN_CLS", "SEQ_2_SEQ_LM"}) {
    CAPTURE(task);
    loom::peft::LoraArguments typed;
    typed.use_peft = true;
    typed.lora_task_type = task;
    CHECK(error(typed) == std::string("loom: --use_peft: task_type \"") + task + "\" is not one loom implements: "
                          "CAUSAL_LM, SEQ_CLS (the classification head trained and saved beside the adapter) or "
                          "FEATURE_EXTRACTION");
  }
  const auto token_cls = nlohmann::json::parse(R"({"r": 4, "target_modules": ["q_proj"], "task_type": "TOKEN_CLS"})");
  CHECK(loom_test::error_of([&] { (void)loom::peft::lora_config_from_json(token_cls, "adapter_config.json"); })
            .starts_with("loom: adapter_config.json: task_type \"TOKEN_CLS\" is not one loom implements"));
  bad.use_peft = true;
  bad.lora_r = 0;
  CHECK(error(bad) == "loom: --use_peft: --lora_r must be a positive integer, got 0");
  bad.lora_r = 8;
  bad.lora_dropout = 1.5;
  CHECK(error(bad) == "loom: --use_peft: --lora_dropout must be in [0, 1), got 1.5");
  bad.lora_dropout = 0;
  CHECK(error(bad, "t5").find("PEFT has no default target modules for model type \"t5\"") != std::string::npos);
  bad.lora_target_modules = "q_proj,,v_proj";
  CHECK(error(bad) == "loom: --lora_target_modules \"q_proj,,v_proj\" holds an empty module name");
  bad.lora_target_modules.reset();
  bad.lora_config = "/nonexistent/adapter_config.json";
  CHECK(error(bad).find("--lora_config gives the whole LoRA config; leave out the --lora_* flags") != std::string::npos);
  loom::peft::LoraArguments from_file;
  from_file.lora_config = "/nonexistent/adapter_config.json";
  CHECK(error(from_file) == "loom: /nonexistent/adapter_config.json does not exist (--lora_config)");
  // Initialisations: a new adapter starts as PEFT's default; one that rewrote its base cannot be read onto ours.
  const auto init_dir = loom_test::fresh_dir("models/lora_init");
  for (const auto& [init, message] : std::vector<std::pair<std::string, std::string>>{
           {"\"gaussian\"", "init_lora_weights is \"gaussian\"; loom makes a new adapter as PEFT's default does"},
           {"false", "init_lora_weights is false; loom makes a new adapter as PEFT's default does"},
           {"\"pissa_niter_4\"", "init_lora_weights \"pissa_niter_4\" rewrites the base weights when the adapter is made"},
           {"\"olora\"", "init_lora_weights \"olora\" rewrites the base weights"}}) {
    CAPTURE(init);
    const auto file = init_dir / "adapter_config.json";
    loom_test::write_bytes(file, R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], )"
                                 R"("init_lora_weights": )" + init + "}");
    loom::peft::LoraArguments with_file;
    with_file.lora_config = file.string();
    CHECK(error(with_file).find(message) != std::string::npos);
  }
  loom_test::write_bytes(init_dir / "adapter_config.json",
                         R"({"peft_type": "LORA", "r": 4, "target_modules": ["q_proj"], "init_lora_weights": true})");
  loom::peft::LoraArguments default_init;
  default_init.lora_config = (init_dir / "adapter_config.json").string();
  CHECK_NOTHROW((void)loom::peft::lora_config_from_args(default_init, "llama"));
  // adapter_config.json's r must be an integer in range (the fuzzer's find: 3e94 converted to int64).
  for (const char* r : {"4.5", "333333333333333333333333333333333"}) {
    CAPTURE(r);
    const auto j = nlohmann::json::parse(std::string(R"({"r": )") + r + R"(, "target_modules": ["q_proj"]})");
    CHECK(loom_test::error_of([&] { (void)loom::peft::lora_config_from_json(j, "adapter_config.json"); })
              .starts_with("loom: adapter_config.json: field 'r' must be an integer, got "));
  }
  // A string field of another type (the fuzzer's second find: a nlohmann type_error escaped).
  const auto numeric = nlohmann::json::parse(R"({"peft_type": 3, "r": 4, "target_modules": ["q_proj"]})");
  CHECK(loom_test::error_of([&] { (void)loom::peft::lora_config_from_json(numeric, "adapter_config.json"); }) ==
        "loom: adapter_config.json: field 'peft_type' must be a string, got 3");
  // A module to save that is not there, and a target that is also to be saved.
  auto plain = LlamaForCausalLM::from_pretrained(base_folder());
  auto config = lora_config();
  config.modules_to_save = {"score"};
  CHECK(loom_test::error_of([&] { loom::peft::apply_lora(*plain, config); }) ==
        "loom: LoRA modules_to_save names score, which matches no module of the model that holds parameters");
  config.modules_to_save = {"q_proj"};
  CHECK(loom_test::error_of([&] { loom::peft::apply_lora(*plain, config); })
            .find("is both a target and in modules_to_save") != std::string::npos);
  config.modules_to_save = {};
  loom::peft::apply_lora(*plain, config);
  CHECK(loom_test::error_of([&] { loom::peft::apply_lora(*plain, config); })
            .find("the model already carries a LoRA adapter") != std::string::npos);
}

}  // namespace lora_trainer_test

namespace lora_trainer_test {

// Windows whose first 4-11 positions are a prompt (-100), as instruction data.
inline loom::data::TensorDataset<CausalLMBatch> prompted(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto ids = torch::randint(2, 100, {n, 16}, gen);
  const auto start = torch::randint(4, 12, {n, 1}, gen);
  return loom::data::TensorDataset<CausalLMBatch>({ids, ids.masked_fill(torch::arange(16).unsqueeze(0) < start, -100)});
}

// transformers' way: every position's logits, then the loss (the forward outside any
// ForwardRequestScope, as an override sees it).
struct FullLogitsTrainer : loom::Trainer<FullLogitsTrainer, LlamaForCausalLM> {
  using Trainer::Trainer;
  loom::ModelOutput compute_loss(LlamaForCausalLM& model, CausalLMBatch& batch) {
    auto out = model->forward(batch);
    CHECK(out.logits.defined());
    return {out.loss, out.logits};
  }
};

TEST_CASE("the Trainer's training forward runs the LM head at the scored positions alone, to the same weights") {
  const auto data = prompted(32, 9);
  auto args = args_for("lora_trainer/scored", 4);
  args.save_strategy = "no";
  const auto train = [&](auto tag, std::optional<bool> chunked) {
    auto model = LlamaForCausalLM::from_pretrained(base_folder());  // full fine-tuning: lm_head trains too
    auto a = args;
    a.chunked_lm_loss = chunked;
    using T = typename decltype(tag)::type;
    T trainer(a, model, data);
    const double loss = trainer.train().training_loss;
    return std::pair{loss, state_of(*model)};
  };
  const auto [full_loss, full] = train(std::type_identity<FullLogitsTrainer>{}, std::nullopt);
  const auto [scored_loss, scored] = train(std::type_identity<Trainer>{}, std::nullopt);
  const auto [chunked_loss, chunked] = train(std::type_identity<Trainer>{}, true);
  // The head at the scored rows: at this size every product is the full one's, bit for bit.
  CHECK(scored_loss == full_loss);
  for (const auto& [name, t] : full) {
    CAPTURE(name);
    CHECK(torch::equal(scored.at(name), t));
    // Chunked: the gradients within float32 rounding (AdamW's normalization magnifies the
    // last bits of small gradients over 4 steps).
    CHECK((chunked.at(name) - t).abs().max().item<double>() <= 1e-4 * t.abs().max().item<double>());
  }
  CHECK(std::abs(chunked_loss - full_loss) <= 1e-6 * std::abs(full_loss));
  // ... and it did run: its other summation order leaves some weight a few bits apart.
  CHECK(std::any_of(full.begin(), full.end(), [&](const auto& kv) { return !torch::equal(chunked.at(kv.first), kv.second); }));

  // Evaluation: with --prediction_loss_only the head runs at the scored rows; the eval_loss is
  // the full logits' one, bit for bit.
  auto model = LlamaForCausalLM::from_pretrained(base_folder());
  auto eval_args = args;
  Trainer with_logits(eval_args, model, data, prompted(12, 10));
  const double reference = with_logits.evaluate().get("eval_loss").value();
  eval_args.prediction_loss_only = true;
  Trainer loss_only(eval_args, model, data, prompted(12, 10));
  CHECK(loss_only.evaluate().get("eval_loss").value() == reference);
  eval_args.chunked_lm_loss = true;
  Trainer chunked_eval(eval_args, model, data, prompted(12, 10));
  CHECK(std::abs(chunked_eval.evaluate().get("eval_loss").value() - reference) <= 1e-6 * reference);
}

}  // namespace lora_trainer_test
