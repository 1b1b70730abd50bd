// loom's GPT-2 and BERT against transformers: tiny random models built and saved by
// transformers (tests/models/hf_models.py), loaded here, compared on logits and loss; saved
// here, opened by transformers; and every malformed folder refused with a loom: error.
#include <loom/checkpoint/safetensors.hpp>
#include <loom/config/json.hpp>
#include <loom/models/bert.hpp>
#include <loom/models/gpt2.hpp>
#include <loom/precision/precision_decl.hpp>

#include <doctest/doctest.h>

#include "../support.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace {

namespace fs = std::filesystem;
using loom::models::BertConfig;
using loom::models::BertForSequenceClassification;
using loom::models::GPT2Config;
using loom::models::GPT2LMHeadModel;
using Named = std::vector<std::pair<std::string, torch::Tensor>>;

std::string script() { return (loom_test::source_dir() / "tests/models/hf_models.py").string(); }

// The folders hf_models.py makes, made once per run (nullopt: no Python).
const fs::path* made(const char* check) {
  static std::optional<fs::path> dir;
  static bool tried = false;
  const char* py = loom_test::python(check);
  if (py == nullptr) return nullptr;
  if (!tried) {
    tried = true;
    const auto d = loom_test::fresh_dir("models/hf");
    const auto out = loom_test::run_capture(std::string(py) + " " + script() + " make " + d.string() + " 2>&1");
    INFO(out);
    REQUIRE(out.find("made gpt2") != std::string::npos);
    dir = d;
  }
  REQUIRE(dir.has_value());
  return &*dir;
}

torch::Tensor named(const Named& all, const std::string& name) {
  for (const auto& [key, t] : all)
    if (key == name) return t;
  FAIL("no tensor " << name);
  return {};
}

// Largest |a - b| over the largest |b|.
double relative(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

// Runs hf_models.py check on `groups` (" kind,folder,inputs,prefix[,exact]" each) and returns
// what it printed; `ok` is whether it succeeded.
std::string python_check(const std::string& groups, bool& ok) {
  const auto out = loom_test::run_capture(std::string(loom_test::python("")) + " " + script() + " check" + groups +
                                          " 2>&1; echo \"exit=$?\"");
  ok = out.find("exit=0") != std::string::npos;
  return out;
}

void copy_folder(const fs::path& from, const fs::path& to) {
  fs::remove_all(to);
  fs::copy(from, to, fs::copy_options::recursive);
}

// A tiny GPT-2 / BERT config (set field by field: designated initializers of these long
// structs draw -Wmissing-field-initializers).
GPT2Config tiny_gpt2(int64_t vocab, int64_t positions, int64_t embd, int64_t layers, int64_t heads) {
  GPT2Config c;
  c.vocab_size = vocab, c.n_positions = positions, c.n_embd = embd, c.n_layer = layers, c.n_head = heads;
  c.bos_token_id = c.eos_token_id = 0;  // inside the vocabulary (transformers warns otherwise)
  return c;
}

}  // namespace

TEST_CASE("GPT-2 and BERT read transformers' folders and give its logits and loss") {
  const fs::path* dir = made("the comparison with transformers");
  if (dir == nullptr) return;
  const auto expected = loom::checkpoint::load_safetensors(*dir / "expected.safetensors");
  torch::NoGradGuard no_grad;
  double worst = 0.0, worst_loss = 0.0;
  for (const std::string folder : {"gpt2", "gpt2_sharded"}) {
    auto model = GPT2LMHeadModel::from_pretrained(*dir / folder);
    model->eval();
    const auto out = model->forward({named(expected, "gpt2_input_ids"), named(expected, "gpt2_labels")});
    const double d = relative(out.logits, named(expected, "gpt2_logits"));
    const double l = relative(out.loss.reshape({1}), named(expected, "gpt2_loss"));
    INFO(folder << ": logits " << d << ", loss " << l);
    CHECK(d <= 1e-5);
    CHECK(l <= 1e-5);
    worst = std::max(worst, d), worst_loss = std::max(worst_loss, l);
    CHECK(torch::equal(model->logits(named(expected, "gpt2_input_ids")), out.logits));
  }
  for (const std::string folder : {"bert", "bert_sharded", "bert_reg", "bert_reg_sharded"}) {
    const std::string prefix = folder.starts_with("bert_reg") ? "bert_reg" : "bert";
    auto model = BertForSequenceClassification::from_pretrained(*dir / folder);
    model->eval();
    const auto out = model->forward({named(expected, prefix + "_input_ids"), named(expected, prefix + "_attention_mask"),
                                     named(expected, prefix + "_labels")});
    const double d = relative(out.logits, named(expected, prefix + "_logits"));
    const double l = relative(out.loss.reshape({1}), named(expected, prefix + "_loss"));
    INFO(folder << ": logits " << d << ", loss " << l);
    CHECK(d <= 1e-5);
    CHECK(l <= 1e-5);
    worst = std::max(worst, d), worst_loss = std::max(worst_loss, l);
  }
  auto bert = BertForSequenceClassification::from_pretrained(*dir / "bert");
  CHECK(bert->config().num_labels == 3);
  CHECK(bert->config().id2label.at(2) == "pos");
  CHECK(bert->config().label2id.at("neu") == 1);
  CHECK(BertForSequenceClassification::from_pretrained(*dir / "bert_reg")->config().num_labels == 1);
  // transformers 5.23 saves "label2id": null for a config given id2label alone: a null map
  // reads as absent, and label2id then inverts id2label.
  const auto nulls = loom_test::fresh_dir("models/label_maps_null");
  copy_folder(*dir / "bert", nulls);
  const auto text = loom_test::read_bytes(nulls / "config.json");
  loom_test::write_bytes(nulls / "config.json", std::regex_replace(text, std::regex("\"label2id\": \\{[^}]*\\}"),
                                                                   "\"label2id\": null"));
  auto relabeled = BertForSequenceClassification::from_pretrained(nulls);
  CHECK(relabeled->config().label2id.at("neu") == 1);
  CHECK(relabeled->config().num_labels == 3);
  MESSAGE("largest relative difference from transformers: logits " << worst << ", loss " << worst_loss);
}

TEST_CASE("BERT's loss is transformers' for each problem_type; labels that do not fit it are one loom: line") {
  const fs::path* dir = made("the problem_type losses");
  if (dir == nullptr) return;
  const auto expected = loom::checkpoint::load_safetensors(*dir / "expected.safetensors");
  torch::NoGradGuard no_grad;
  // Each folder's config.json carries its problem_type (bert_unset none: inferred from float labels).
  for (const std::string name : {"bert_single_label_classification", "bert_multi_label_classification",
                                 "bert_regression", "bert_unset"}) {
    auto model = BertForSequenceClassification::from_pretrained(*dir / name);
    model->eval();
    const auto out = model->forward({named(expected, name + "_input_ids"), named(expected, name + "_attention_mask"),
                                     named(expected, name + "_labels")});
    const double l = relative(out.loss.reshape({1}), named(expected, name + "_loss"));
    INFO(name << ": loss " << l);
    CHECK(l <= 1e-5);
    CHECK(relative(out.logits, named(expected, name + "_logits")) <= 1e-5);
  }
  CHECK_FALSE(BertForSequenceClassification::from_pretrained(*dir / "bert_unset")->config().problem_type.has_value());

  // Labels of the wrong dtype or shape: one line naming the problem type and what it takes.
  BertConfig c;
  c.vocab_size = 40, c.hidden_size = 16, c.num_hidden_layers = 1, c.num_attention_heads = 2, c.intermediate_size = 32;
  c.num_labels = 3;
  const auto logits = torch::randn({4, 3});
  const auto ints = torch::tensor({0, 2, 1, 1}), floats = torch::rand({4});
  const auto loss_error = [&](std::optional<std::string> problem_type, int64_t num_labels, const torch::Tensor& l,
                              const torch::Tensor& labels) {
    auto config = c;
    config.problem_type = std::move(problem_type), config.num_labels = num_labels;
    return loom_test::error_of([&] { BertForSequenceClassification(config)->loss(l, labels); });
  };
  const std::string with = "loom: BertForSequenceClassification with ";
  CHECK(loss_error("multi_label_classification", 3, logits, ints) ==
        with + "problem_type multi_label_classification takes floating-point 0/1 targets, one per label (shape "
               "[4, 3]); got Long labels of shape [4]");
  CHECK(loss_error("multi_label_classification", 3, logits, floats) ==
        with + "problem_type multi_label_classification takes floating-point 0/1 targets, one per label (shape "
               "[4, 3]); got Float labels of shape [4]");
  CHECK(loss_error("regression", 3, logits, floats) ==
        with + "problem_type regression takes floating-point labels, num_labels targets per example (shape [4, 3]); "
               "got Float labels of shape [4]");
  CHECK(loss_error("regression", 1, logits.narrow(1, 0, 1), ints) ==
        with + "problem_type regression takes floating-point labels, one per example (shape [4] or [4, 1]); got "
               "Long labels of shape [4]");
  CHECK(loss_error(std::nullopt, 1, logits.narrow(1, 0, 1), ints) ==
        with + "problem_type unset (inferred: regression, from num_labels 1 and Long labels) takes floating-point "
               "labels, one per example (shape [4] or [4, 1]); got Long labels of shape [4]");
  CHECK(loss_error("single_label_classification", 3, logits, floats) ==
        with + "problem_type single_label_classification takes integer class ids (int64 or int32), one per example "
               "(shape [4]); got Float labels of shape [4]");
  CHECK(loss_error("single_label_classification", 3, logits, torch::zeros({4, 3}, torch::kLong)) ==
        with + "problem_type single_label_classification takes integer class ids (int64 or int32), one per example "
               "(shape [4]); got Long labels of shape [4, 3]");
  CHECK(loss_error(std::nullopt, 3, logits, floats) ==
        with + "problem_type unset (inferred: multi_label_classification, from num_labels 3 and Float labels) takes "
               "floating-point 0/1 targets, one per label (shape [4, 3]); got Float labels of shape [4]");
  // What fits: one regression target per example as [batch] or [batch, 1]; int32 class ids as int64.
  auto regressor = c;
  regressor.num_labels = 1;
  BertForSequenceClassification reg(regressor);
  const auto one = logits.narrow(1, 0, 1);
  CHECK(torch::equal(reg->loss(one, floats), reg->loss(one, floats.view({4, 1}))));
  BertForSequenceClassification classify(c);
  CHECK(torch::equal(classify->loss(logits, ints), classify->loss(logits, ints.to(torch::kInt))));
  CHECK(torch::allclose(classify->loss(logits, ints), torch::nn::functional::cross_entropy(logits, ints)));
}

TEST_CASE("what loom saves, transformers opens with no missing or unexpected weights and the same logits") {
  const fs::path* dir = made("the comparison with transformers");
  if (dir == nullptr) return;
  const auto inputs = (*dir / "expected.safetensors").string();
  const auto out = loom_test::fresh_dir("models/saved");
  bool ok = false;
  // Loaded from transformers' files and saved back: the same weights, so identical logits.
  GPT2LMHeadModel::from_pretrained(*dir / "gpt2")->save_pretrained(out / "gpt2");
  GPT2LMHeadModel::from_pretrained(*dir / "gpt2_sharded")->save_pretrained(out / "gpt2_sharded", {.max_shard_size = 20000});
  BertForSequenceClassification::from_pretrained(*dir / "bert")->save_pretrained(out / "bert");
  BertForSequenceClassification::from_pretrained(*dir / "bert_reg_sharded")
      ->save_pretrained(out / "bert_reg", {.max_shard_size = 20000});
  CHECK(fs::exists(out / "gpt2" / "model.safetensors"));
  CHECK(loom::checkpoint::load_safetensors_metadata(out / "gpt2" / "model.safetensors") ==
        std::map<std::string, std::string>{{"format", "pt"}});
  CHECK(fs::exists(out / "gpt2_sharded" / "model.safetensors.index.json"));
  CHECK_FALSE(fs::exists(out / "gpt2_sharded" / "model.safetensors"));
  std::string groups;  // one Python process for every check (importing transformers takes seconds)
  for (const auto& [kind, folder, prefix] : {std::tuple{"gpt2", "gpt2", "gpt2"}, std::tuple{"gpt2", "gpt2_sharded", "gpt2"},
                                             std::tuple{"bert", "bert", "bert"}, std::tuple{"bert", "bert_reg", "bert_reg"}})
    groups += std::string(" ") + kind + "," + (out / folder).string() + "," + inputs + "," + prefix + ",exact";
  // The same layout transformers writes for a sharded save: the index lists every tensor.
  const auto index = loom::json::read_file(out / "gpt2_sharded" / "model.safetensors.index.json");
  const auto hf_index = loom::json::read_file(*dir / "gpt2_sharded" / "model.safetensors.index.json");
  CHECK(index["weight_map"].size() == hf_index["weight_map"].size());
  CHECK(index["metadata"]["total_size"] == hf_index["metadata"]["total_size"]);
  CHECK(index["metadata"]["total_parameters"] == hf_index["metadata"]["total_parameters"]);

  // A random model built here from a config: transformers' logits equal loom's within 1e-5.
  torch::manual_seed(3);
  GPT2LMHeadModel fresh(tiny_gpt2(128, 32, 32, 2, 4));
  fresh->eval();
  fresh->save_pretrained(out / "fresh");
  const auto ids = torch::randint(0, 128, {2, 10}, torch::kLong);
  torch::Tensor logits;
  {
    torch::NoGradGuard no_grad;
    const auto o = fresh->forward({ids, ids});
    logits = o.logits;
    loom::checkpoint::save_safetensors({{"fresh_input_ids", ids}, {"fresh_labels", ids}, {"fresh_logits", o.logits},
                                        {"fresh_loss", o.loss.reshape({1})}},
                                       out / "fresh.safetensors");
  }
  groups += " gpt2," + (out / "fresh").string() + "," + (out / "fresh.safetensors").string() + ",fresh";
  const auto said = python_check(groups, ok);
  INFO(said);
  CHECK(ok);
  CHECK(said.find("FAILED") == std::string::npos);
  CHECK(said.find("2: 'pos'") != std::string::npos);  // BERT's id2label, read back by transformers
  const auto line = said.find("fresh: ");
  MESSAGE(said.substr(line, said.find('\n', line) - line));
}

TEST_CASE("a malformed HF folder is a loom: error naming the file and the problem") {
  const fs::path* dir = made("the malformed-folder cases");
  if (dir == nullptr) return;
  const auto work = loom_test::fresh_dir("models/bad");
  const auto load_gpt2 = [&](const fs::path& d) { return loom_test::error_of([&] { GPT2LMHeadModel::from_pretrained(d); }); };
  const auto rewrite = [&](const std::string& name, auto&& edit) {
    const auto d = work / name;
    copy_folder(*dir / "gpt2", d);
    auto tensors = loom::checkpoint::load_safetensors(d / "model.safetensors");
    edit(tensors);
    loom::checkpoint::save_safetensors(tensors, d / "model.safetensors", {{"format", "pt"}});
    return d;
  };

  auto e = load_gpt2(rewrite("missing", [](Named& t) {
    std::erase_if(t, [](const auto& p) { return p.first == "transformer.h.1.mlp.c_proj.weight"; });
  }));
  CHECK(e.starts_with("loom: "));
  CHECK(e.find("missing transformer.h.1.mlp.c_proj.weight") != std::string::npos);

  e = load_gpt2(rewrite("extra", [](Named& t) { t.emplace_back("transformer.h.0.attn.extra", torch::zeros({3})); }));
  CHECK(e.find("unexpected transformer.h.0.attn.extra") != std::string::npos);

  e = load_gpt2(rewrite("shape", [](Named& t) {
    for (auto& [n, v] : t)
      if (n == "transformer.ln_f.weight") v = torch::ones({31});
  }));
  CHECK(e.find("shape of transformer.ln_f.weight is [31] in the file but [32] in the model") != std::string::npos);

  // What HF itself allows: the tied head's copy, the legacy attention buffers, bf16 storage.
  auto d = rewrite("allowed", [](Named& t) {
    t.emplace_back("lm_head.weight", named(t, "transformer.wte.weight").clone());
    t.emplace_back("transformer.h.0.attn.bias", torch::ones({1, 1, 32, 32}));
    t.emplace_back("transformer.h.0.attn.masked_bias", torch::tensor(-1e4));
    for (auto& [n, v] : t) v = v.to(torch::kBFloat16);
  });
  auto loaded = GPT2LMHeadModel::from_pretrained(d);
  CHECK((loaded->transformer->wte->weight.scalar_type() == torch::kFloat));
  e = load_gpt2(rewrite("tied_shape", [](Named& t) { t.emplace_back("lm_head.weight", torch::zeros({5, 32})); }));
  CHECK(e.find("shape of lm_head.weight is [5, 32] in the file") != std::string::npos);

  // The original GPT-2 checkpoints: the bare GPT2Model's names, without "transformer.".
  d = rewrite("bare", [](Named& t) {
    for (auto& [n, v] : t) n = n.substr(std::string("transformer.").size());
  });
  CHECK(loom_test::error_of([&] { GPT2LMHeadModel::from_pretrained(d); }) == "<no loom::Error>");

  // config.json: a wrong model_type, a known key of the wrong type; unknown keys are fine.
  d = work / "model_type";
  copy_folder(*dir / "gpt2", d);
  auto config = loom_test::read_bytes(d / "config.json");
  loom_test::write_bytes(d / "config.json", std::regex_replace(config, std::regex("\"gpt2\""), "\"llama\""));
  e = load_gpt2(d);
  CHECK(e == "loom: " + (d / "config.json").string() + ": field 'model_type' is \"llama\", but this model reads \"gpt2\"");
  e = loom_test::error_of([&] { BertForSequenceClassification::from_pretrained(*dir / "gpt2"); });
  CHECK(e.find("field 'model_type' is \"gpt2\", but this model reads \"bert\"") != std::string::npos);
  loom_test::write_bytes(d / "config.json", std::regex_replace(config, std::regex("\"n_embd\": 32"), "\"n_embd\": \"32\""));
  e = load_gpt2(d);
  CHECK(e.starts_with("loom: " + (d / "config.json").string() + ": "));
  CHECK(e.find("'n_embd' expects an integer") != std::string::npos);
  loom_test::write_bytes(d / "config.json", std::regex_replace(config, std::regex("\"n_head\": 4"), "\"n_head\": 5"));
  CHECK(load_gpt2(d).find("n_embd (32) must be a multiple of n_head (5)") != std::string::npos);
  // Sizes beyond ConfigLimits stop at the config, before any layer is built; sizes within
  // them that the weights do not have stop at the weight files' headers, before anything is
  // allocated (n_layer 1000 or n_embd 65536 would build gigabytes first).
  const auto with = [&](const fs::path& from, const std::string& name, const nlohmann::json& changes) {
    const auto to = work / name;
    copy_folder(from, to);
    auto j = nlohmann::json::parse(loom_test::read_bytes(from / "config.json"));
    j.update(changes);
    loom_test::write_bytes(to / "config.json", j.dump());
    return to;
  };
  const auto config_of = [&](const fs::path& f) { return "loom: " + (f / "config.json").string() + ": "; };
  for (const auto& [key, value, limit] : {std::tuple{"n_layer", int64_t{1000000000}, "1024"},
                                          std::tuple{"n_embd", int64_t{1000000000}, "65536"},
                                          std::tuple{"vocab_size", int64_t{1} << 62, "16777216"},
                                          std::tuple{"n_positions", int64_t{-1}, "1048576"},
                                          std::tuple{"n_inner", int64_t{1} << 40, "262144"}}) {
    d = with(*dir / "gpt2", std::string("big_") + key, {{key, value}});
    CHECK(load_gpt2(d) == config_of(d) + "field '" + key + "' must be a positive integer at most " + limit +
                              ", got " + std::to_string(value));
  }
  d = with(*dir / "gpt2", "deeper", {{"n_layer", 1000}, {"n_embd", 65536}, {"n_head", 1}});
  CHECK(load_gpt2(d) == "loom: " + (d / "config.json").string() + " does not match the weights in " + d.string() +
                            ": vocab_size 128, n_embd 65536 give transformer.wte.weight the shape [128, 65536], "
                            "the weights [128, 32]; n_positions 32, n_embd 65536 give transformer.wpe.weight the "
                            "shape [32, 65536], the weights [32, 32]; no transformer.h.999.mlp.c_fc.weight in the "
                            "weights (n_layer 1000, n_embd 65536, inner width 262144)");
  d = with(*dir / "gpt2_sharded", "wider_sharded", {{"vocab_size", 200}});
  CHECK(load_gpt2(d).find("config.json does not match the weights in " + d.string() + ": vocab_size 200, n_embd 32 "
                          "give transformer.wte.weight the shape [200, 32], the weights [128, 32]") != std::string::npos);
  const auto load_bert = [&](const fs::path& f) {
    return loom_test::error_of([&] { BertForSequenceClassification::from_pretrained(f); });
  };
  d = with(*dir / "bert", "bert_labels", {{"id2label", nullptr}, {"label2id", nullptr}, {"num_labels", 1000000000}});
  CHECK(load_bert(d) == config_of(d) + "field 'num_labels' must be a positive integer at most 1048576, got 1000000000");
  d = with(*dir / "bert", "bert_layers", {{"num_hidden_layers", 1000000000}});
  CHECK(load_bert(d) == config_of(d) + "field 'num_hidden_layers' must be a positive integer at most 1024, got 1000000000");
  d = with(*dir / "bert", "bert_deeper", {{"num_hidden_layers", 12}, {"intermediate_size", 100000}});
  CHECK(load_bert(d) == "loom: " + (d / "config.json").string() + " does not match the weights in " + d.string() +
                            ": no bert.encoder.layer.11.intermediate.dense.weight in the weights (num_hidden_layers "
                            "12, intermediate_size 100000, hidden_size 32)");

  d = work / "model_type";
  loom_test::write_bytes(d / "config.json", "{\"model_type\": \"gpt2\", \"n_embd\": 1, \"n_embd\": 2}");
  CHECK(load_gpt2(d).find("key 'n_embd' appears twice") != std::string::npos);

  // Sharded folders: a corrupt index, an index naming a missing file, a shard with a tensor
  // the index does not list.
  d = work / "index";
  copy_folder(*dir / "gpt2_sharded", d);
  const auto index = loom_test::read_bytes(d / "model.safetensors.index.json");
  loom_test::write_bytes(d / "model.safetensors.index.json", index.substr(0, index.size() / 2));
  e = load_gpt2(d);
  CHECK(e.starts_with("loom: " + (d / "model.safetensors.index.json").string() + " is not valid JSON"));
  loom_test::write_bytes(d / "model.safetensors.index.json", "{\"weight_map\": [1, 2]}");
  CHECK(load_gpt2(d).find("field 'weight_map' must be a JSON object") != std::string::npos);
  loom_test::write_bytes(d / "model.safetensors.index.json",
                         std::regex_replace(index, std::regex("model-00003-of-00008"), "model-00009-of-00008"));
  CHECK(load_gpt2(d).find("model-00009-of-00008.safetensors (for ") != std::string::npos);
  loom_test::write_bytes(d / "model.safetensors.index.json",
                         std::regex_replace(index, std::regex("\"model-00003-of-00008"), "\"../model-00003-of-00008"));
  CHECK(load_gpt2(d).find("which is not a file name in the folder") != std::string::npos);
  loom_test::write_bytes(d / "model.safetensors.index.json",
                         std::regex_replace(index, std::regex("(\"transformer.h.0.ln_1.bias\": \")model-00002"),
                                            "$1model-00004"));
  e = load_gpt2(d);
  CHECK(e.find("transformer.h.0.ln_1.bias") != std::string::npos);
  CHECK(e.find("does not map to it") != std::string::npos);
  fs::remove(d / "model.safetensors.index.json");
  CHECK(load_gpt2(d).find("holds neither model.safetensors nor model.safetensors.index.json") != std::string::npos);
  CHECK(load_gpt2(work / "nothing") == "loom: " + (work / "nothing").string() + " does not exist (an HF model folder "
                                        "holds config.json and model.safetensors)");
}

TEST_CASE("GPT-2 and BERT count their parameters from the config; a model the host cannot hold stops before it is built") {
  GPT2Config g;
  g.vocab_size = 50, g.n_positions = 16, g.n_layer = 2, g.n_head = 2, g.n_embd = 16;
  CHECK(parameter_count(g) == GPT2LMHeadModel(g)->num_parameters());
  g.n_inner = 24, g.tie_word_embeddings = false;
  CHECK(parameter_count(g) == GPT2LMHeadModel(g)->num_parameters());

  BertConfig b;
  b.vocab_size = 40, b.hidden_size = 16, b.num_hidden_layers = 2, b.num_attention_heads = 2, b.intermediate_size = 24;
  b.max_position_embeddings = 20, b.type_vocab_size = 3, b.num_labels = 5;
  CHECK(parameter_count(b) == BertForSequenceClassification(b)->num_parameters());
  CHECK(loom::models::BertForMaskedLMImpl::parameter_count(b) == loom::models::BertForMaskedLM(b)->num_parameters());
  b.tie_word_embeddings = false;
  CHECK(loom::models::BertForMaskedLMImpl::parameter_count(b) == loom::models::BertForMaskedLM(b)->num_parameters());

  // Within ConfigLimits, but 1024 blocks of width 65,536: about 5.3e13 parameters. The
  // constructor stops before the first layer (building it would take minutes and then fail).
  GPT2Config huge = g;
  huge.n_layer = 1024, huge.n_embd = 65536, huge.n_head = 1, huge.n_inner = std::nullopt;
  const auto e = loom_test::error_of([&] { GPT2LMHeadModel m(huge); });
  CHECK(e.starts_with("loom: GPT2Config: this config gives the model " + std::to_string(parameter_count(huge)) +
                      " parameters, "));
  CHECK(e.find("GB in float32 (a model is built in float32 before any conversion), more than the ") != std::string::npos);
  CHECK(e.ends_with(": choose a smaller config"));
  // The comparison itself: 4 bytes a parameter against the memory of one process.
  using loom::models::detail::check_parameter_memory;
  CHECK(loom_test::error_of([] { check_parameter_memory(1000, 4000.0, 1, "c"); }) == "<no loom::Error>");
  CHECK(loom_test::error_of([] { check_parameter_memory(1000, 0.0, 1, "c"); }) == "<no loom::Error>");  // unknown
  CHECK(loom_test::error_of([] { check_parameter_memory(1001, 4000.0, 1, "c"); }).starts_with("loom: c: this config"));
  CHECK(loom_test::error_of([] { check_parameter_memory(1000, 4000.0, 2, "c"); })
            .find("than the 0.0 GB of host memory each of this machine's 2 processes has") != std::string::npos);
}

TEST_CASE("the models' parameter names are HF's, with each block a FullShard unit") {
  torch::manual_seed(0);
  GPT2LMHeadModel gpt2(tiny_gpt2(50, 16, 16, 2, 2));
  const auto params = gpt2->named_parameters(true);
  std::vector<std::string> names;
  for (const auto& p : params) names.push_back(p.key());
  const std::vector<std::string> first = {"transformer.wte.weight", "transformer.wpe.weight",
                                          "transformer.h.0.ln_1.weight", "transformer.h.0.ln_1.bias",
                                          "transformer.h.0.attn.c_attn.weight"};
  CHECK(std::vector<std::string>(names.begin(), names.begin() + 5) == first);
  CHECK(names.back() == "transformer.ln_f.bias");
  CHECK(names.size() == 2 + 12 * 2 + 2);
  CHECK(params["transformer.h.1.mlp.c_fc.weight"].sizes() == torch::IntArrayRef{16, 64});  // Conv1D: [in, out]
  // The blocks are FullShard units; the wrapper adds nothing to the names.
  const auto modules = gpt2->named_modules();
  CHECK(dynamic_cast<loom::dist::FullShardUnitBase*>(modules["transformer.h.0"].get()) != nullptr);
  CHECK(dynamic_cast<loom::dist::FullShardUnitBase*>(modules["transformer.h.1"].get()) != nullptr);
  CHECK(gpt2->num_parameters(true) == gpt2->num_parameters() - 50 * 16 - 16 * 16);

  // HF's initialization: LayerNorms 1/0, biases 0, the residual projections scaled down.
  CHECK(torch::equal(params["transformer.h.0.ln_2.weight"], torch::ones({16})));
  CHECK(params["transformer.h.0.attn.c_attn.bias"].abs().max().item<float>() == 0.0f);
  const double proj = params["transformer.h.0.mlp.c_proj.weight"].std().item<double>();
  const double fc = params["transformer.h.0.mlp.c_fc.weight"].std().item<double>();
  CHECK(proj == doctest::Approx(0.02 / 2.0).epsilon(0.15));
  CHECK(fc == doctest::Approx(0.02).epsilon(0.15));

  BertConfig bc;
  bc.vocab_size = 40, bc.hidden_size = 16, bc.num_hidden_layers = 2, bc.num_attention_heads = 2;
  bc.intermediate_size = 32, bc.max_position_embeddings = 20, bc.num_labels = 4;
  BertForSequenceClassification bert(bc);
  const auto bp = bert->named_parameters(true);
  for (const char* name : {"bert.embeddings.word_embeddings.weight", "bert.embeddings.LayerNorm.bias",
                           "bert.encoder.layer.1.attention.self.value.weight",
                           "bert.encoder.layer.0.attention.output.LayerNorm.weight",
                           "bert.encoder.layer.0.intermediate.dense.weight", "bert.encoder.layer.0.output.dense.bias",
                           "bert.pooler.dense.weight", "classifier.weight"})
    CHECK_MESSAGE(bp.contains(name), name);
  CHECK(bp["classifier.weight"].sizes() == torch::IntArrayRef{4, 16});
  CHECK(bp["bert.embeddings.word_embeddings.weight"][0].abs().max().item<float>() == 0.0f);  // the padding row
  CHECK(dynamic_cast<loom::dist::FullShardUnitBase*>(bert->named_modules()["bert.encoder.layer.1"].get()) != nullptr);
  CHECK(bert->config().id2label.at(3) == "LABEL_3");

  // A config that cannot be built is a loom: error.
  CHECK(loom_test::error_of([] { GPT2LMHeadModel(tiny_gpt2(50, 16, 30, 1, 4)); }) ==
        "loom: GPT2Config: n_embd (30) must be a multiple of n_head (4)");
  auto gc = tiny_gpt2(50, 16, 16, 1, 2);
  gc.activation_function = "gelu_fast";
  CHECK(loom_test::error_of([&] { GPT2LMHeadModel{gc}; }).find("field 'activation_function' is \"gelu_fast\"") !=
        std::string::npos);
  bc.problem_type = "single_label_classification", bc.num_labels = 1;
  CHECK(loom_test::error_of([&] { BertForSequenceClassification{bc}; }).find("needs num_labels > 1") !=
        std::string::npos);
}

TEST_CASE("config.json round trip: every field, label maps and unknown keys") {
  const auto dir = loom_test::fresh_dir("models/config");
  BertConfig c;
  c.hidden_act = "gelu_new", c.classifier_dropout = 0.25, c.problem_type = "multi_label_classification";
  c.id2label = {{0, "a"}, {1, "b"}};
  loom::models::complete_labels(c);
  loom::models::write_hf_config(c, dir, "BertForSequenceClassification");
  const auto j = loom::json::read_file(dir / "config.json");
  CHECK(j["model_type"] == "bert");
  CHECK(j["architectures"] == nlohmann::json::array({"BertForSequenceClassification"}));
  CHECK(j["id2label"]["1"] == "b");
  CHECK(j["label2id"]["a"] == 0);
  CHECK(j["bos_token_id"].is_null());
  const auto back = loom::models::read_hf_config<BertConfig>(dir);
  CHECK(back.hidden_act == "gelu_new");
  CHECK(back.classifier_dropout == 0.25);
  CHECK(back.problem_type == "multi_label_classification");
  CHECK(back.id2label == c.id2label);
  CHECK(back.label2id == c.label2id);
  CHECK_FALSE(back.bos_token_id.has_value());

  loom_test::write_bytes(dir / "config.json", R"({"model_type": "bert", "transformers_version": "5.0",
    "architectures": ["BertModel"], "torch_dtype": "float16", "hidden_size": 64, "id2label": {"x": "y"}})");
  CHECK(loom_test::error_of([&] { loom::models::read_hf_config<BertConfig>(dir); })
            .find("id2label' expects an object of \"<integer>\": \"<label>\" pairs; the key \"x\" is not an integer") !=
        std::string::npos);
  loom_test::write_bytes(dir / "config.json", R"({"transformers_version": "5.0", "hidden_size": 64})");
  CHECK(loom::models::read_hf_config<BertConfig>(dir).hidden_size == 64);
  CHECK(loom::models::parse_shard_size("50GB") == 50'000'000'000);
  CHECK(loom::models::parse_shard_size("20KiB") == 20 * 1024);
  CHECK(loom_test::error_of([] { loom::models::parse_shard_size("5 parsecs"); }).starts_with("loom: "));
}

TEST_CASE("GPT-2's fast kernels compute the reference's function: padded LM head, fused GELU") {
  // Kernels::fast on the CPU: the vocabulary (50, not a multiple of 64) padded in the LM
  // head's product, gelu_new as torch's fused tanh GELU. Logits keep vocab_size columns, and
  // logits, loss and gradients agree with the reference operations to float32 rounding.
  for (const bool tied : {true, false}) {
    CAPTURE(tied);
    auto config = tiny_gpt2(50, 16, 32, 2, 4);
    config.tie_word_embeddings = tied;
    torch::manual_seed(3);
    GPT2LMHeadModel model(config);
    model->eval();  // no dropout: every forward computes the same function
    REQUIRE((model->kernels() == loom::models::Kernels::automatic));
    const auto ids = torch::randint(50, {3, 16});
    const loom::data::CausalLMBatch batch{ids, ids};
    const auto run = [&](loom::models::Kernels kernels) {
      model->set_kernels(kernels);
      model->zero_grad();
      auto out = model->forward(batch);
      out.loss.backward();
      std::vector<torch::Tensor> grads;
      for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
      return std::tuple{out.logits.detach().clone(), out.loss.item<double>(), grads};
    };
    const auto [ref_logits, ref_loss, ref_grads] = run(loom::models::Kernels::reference);
    const auto [fast_logits, fast_loss, fast_grads] = run(loom::models::Kernels::fast);
    REQUIRE(fast_logits.sizes() == ref_logits.sizes());
    CHECK(fast_logits.size(-1) == 50);
    CHECK(relative(fast_logits, ref_logits) < 1e-5);
    CHECK(fast_loss == doctest::Approx(ref_loss).epsilon(1e-6));
    for (std::size_t i = 0; i < ref_grads.size(); ++i) {
      CAPTURE(i);
      CHECK(relative(fast_grads[i], ref_grads[i]) < 1e-4);
    }
    // On the CPU the automatic choice is the reference: bitwise.
    const auto [auto_logits, auto_loss, auto_grads] = run(loom::models::Kernels::automatic);
    CHECK(torch::equal(auto_logits, ref_logits));
  }
  // Under bf16 autocast the padded product runs in bf16, as the unpadded one would.
  auto config = tiny_gpt2(50, 16, 32, 1, 4);
  torch::manual_seed(4);
  GPT2LMHeadModel model(config);
  model->eval();
  const auto ids = torch::randint(50, {2, 16});
  torch::Tensor ref, fast;
  {
    const loom::precision::Autocast autocast(torch::kCPU, torch::kBFloat16);
    model->set_kernels(loom::models::Kernels::reference);
    ref = model->logits(ids);
    model->set_kernels(loom::models::Kernels::fast);
    fast = model->logits(ids);
  }
  CHECK((fast.scalar_type() == torch::kBFloat16));
  CHECK((ref.scalar_type() == torch::kBFloat16));
  CHECK(relative(fast.to(torch::kFloat), ref.to(torch::kFloat)) < 2e-2);
}
