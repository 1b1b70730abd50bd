// QLoRA (loom/peft/bnb4.hpp, quantize_base_4bit, --load_in_4bit): bitsandbytes' 4-bit format
// byte for byte against bitsandbytes itself (codes, absmaxes, double quantization, dequantized
// values, matmul_4bit and its input gradient); a Llama whose base is 4-bit trains its adapter
// in the Trainer, resumes bitwise, and the adapter gives the same loss under PEFT over
// transformers' own 4-bit reading of the base; TRL's flags, each mistake one loom: line.

#include <loom/loom.hpp>
#include <loom/models/llama.hpp>
#include <loom/peft/bnb4.hpp>
#include <loom/peft/lora_arguments.hpp>

#include <doctest/doctest.h>

#include "../support.hpp"

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace qlora_test {

namespace fs = std::filesystem;
using loom::data::CausalLMBatch;
using loom::models::LlamaForCausalLM;
using loom::peft::Bnb4Type;
using Trainer = loom::DefaultTrainer<LlamaForCausalLM>;

inline std::string script() { return (loom_test::source_dir() / "tests/models/hf_qlora.py").string(); }

inline loom::models::LlamaConfig tiny() {
  loom::models::LlamaConfig c;
  c.vocab_size = 100, c.hidden_size = 64, c.intermediate_size = 128, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = 64;
  c.bos_token_id = 0, c.eos_token_id = 1;
  return c;
}

inline const fs::path& base_folder() {
  static const fs::path dir = [] {
    torch::manual_seed(3);
    const auto d = loom_test::fresh_dir("models/qlora_base");
    LlamaForCausalLM(tiny())->save_pretrained(d);
    return d;
  }();
  return dir;
}

inline loom::data::TensorDataset<CausalLMBatch> windows(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto ids = torch::randint(2, 100, {n, 16}, gen);
  return loom::data::TensorDataset<CausalLMBatch>({ids, ids.clone()});
}

// The base from its folder, made 4-bit (NF4, double quantization), the adapter on.
inline LlamaForCausalLM qlora_model() {
  auto model = LlamaForCausalLM::from_pretrained(base_folder());
  CHECK(loom::peft::quantize_base_4bit(*model, {.quant_type = Bnb4Type::nf4, .use_double_quant = true}) == 14);
  torch::manual_seed(11);
  loom::peft::LoraConfig lora;
  lora.r = 4, lora.lora_alpha = 8, lora.target_modules = {"q_proj", "v_proj"};
  CHECK(loom::peft::apply_lora(*model, lora) == 4);
  return model;
}

inline loom::peft::AdaptableLinearImpl& layer(LlamaForCausalLM& model, const std::string& name) {
  for (const auto& item : model->named_modules())
    if (item.key() == name) return *item.value()->as<loom::peft::AdaptableLinear>();
  FAIL("no module " << name);
  throw std::logic_error("unreachable");
}

TEST_CASE("bitsandbytes' 4-bit format: codes, absmaxes, double quantization and matmul_4bit equal bitsandbytes'") {
  struct Case {
    std::vector<int64_t> shape;
    Bnb4Type type;
    bool nested;
    torch::ScalarType dtype;
    bool linear;
  };
  // Full blocks, a short last block, an odd count (a padded half byte), a single block (its
  // nested absmax 0), bfloat16 input, and enough blocks for several nested blocks. (Rows of a
  // multiple of 16 values that is not one of 64 are left out: bitsandbytes 0.50's AVX-512 CPU
  // dequantizer reads the absmaxes row by row there and gives other values than its own scalar
  // path and its CUDA kernels, which loom's equal; docs/semantics.md.)
  const std::vector<Case> cases = {
      {{96, 64}, Bnb4Type::nf4, true, torch::kFloat, true},   {{33, 20}, Bnb4Type::nf4, false, torch::kFloat, false},
      {{7, 9}, Bnb4Type::fp4, true, torch::kFloat, false},    {{64, 128}, Bnb4Type::fp4, false, torch::kBFloat16, true},
      {{300, 256}, Bnb4Type::nf4, true, torch::kFloat, false}, {{40, 64}, Bnb4Type::fp4, true, torch::kFloat, true},
  };
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  std::map<std::string, std::string> meta{{"format", "pt"}};
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    const std::string name = "case" + std::to_string(i);
    CAPTURE(name);
    // Rows of different scales, so the blocks' absmaxes differ widely.
    const auto rows = torch::rand({c.shape[0], 1}, gen) * 0.2 + 0.01;
    const auto w = (torch::randn(c.shape, gen) * rows).to(c.dtype);
    const auto q = loom::peft::quantize_4bit(w, c.type, c.nested);
    const auto deq = loom::peft::dequantize_4bit(q, c.dtype);
    REQUIRE(q.packed.sizes() == torch::IntArrayRef{(w.numel() + 1) / 2, 1});
    CHECK((q.packed.scalar_type() == torch::kUInt8));
    CHECK(q.shape == w.sizes().vec());
    CHECK(deq.sizes() == w.sizes());
    // Every value within half the widest gap between codes (FP4: 1/3, NF4: 0.277) of its block's absmax.
    if (!c.nested) {
      const auto blocks = w.to(torch::kFloat).reshape(-1);
      const auto scale = q.absmax.repeat_interleave(64).slice(0, 0, blocks.numel());
      CHECK(((blocks - deq.to(torch::kFloat).reshape(-1)).abs() <= scale * (0.5 / 3 + 1e-6)).all().item<bool>());
    }
    tensors.insert(tensors.end(), {{name + ".weight", w}, {name + ".packed", q.packed}, {name + ".absmax", q.absmax},
                                   {name + ".dequantized", deq}});
    if (c.nested) {
      CHECK((q.absmax.scalar_type() == torch::kUInt8));
      tensors.insert(tensors.end(), {{name + ".nested_absmax", q.nested_absmax}, {name + ".offset", q.offset.reshape({1})},
                                     {name + ".nested_code", loom::peft::dynamic_map_8bit()}});
    }
    meta[name] = std::string(loom::peft::bnb4_type_name(c.type)) + (c.nested ? ",1" : ",0");
    if (c.linear) {
      // linear_4bit is the float linear through the dequantized weight; its gradient reaches x
      // alone, through the weight dequantized in the dtype it came from (bfloat16 here rounds).
      const auto x = torch::randn({5, c.shape[1]}, gen).requires_grad_(true);
      const auto grad_out = torch::randn({5, c.shape[0]}, gen);
      const auto y = loom::peft::linear_4bit(x, q, torch::Tensor());
      y.backward(grad_out);
      CHECK(torch::equal(y.detach(), torch::nn::functional::linear(x.detach(), loom::peft::dequantize_4bit(q, torch::kFloat))));
      const auto through = loom::peft::dequantize_4bit(q, c.dtype).to(torch::kFloat);
      CHECK(torch::allclose(x.grad(), grad_out.matmul(through), 1e-6, 1e-6));
      tensors.insert(tensors.end(), {{name + ".x", x.detach()}, {name + ".grad_out", grad_out}, {name + ".y", y.detach()},
                                     {name + ".grad_x", x.grad()}});
    }
  }
  // About half a byte per value, double-quantized: 0.5 + 1/64 + 4/16384.
  const auto big = loom::peft::quantize_4bit(torch::randn({300, 256}, gen), Bnb4Type::nf4, true);
  const double per_value = static_cast<double>(big.bytes()) / static_cast<double>(big.numel());
  CHECK(per_value == doctest::Approx(0.5 + 1.0 / 64 + 24.0 / 76800).epsilon(1e-9));
  CHECK(loom::peft::quantize_4bit(torch::randn({300, 256}, gen), Bnb4Type::nf4, false).bytes() == 38400 + 1200 * 4);

  // Refused: integer tensors, a blocksize bitsandbytes lacks, an unknown type name.
  CHECK(loom_test::error_of([] { (void)loom::peft::quantize_4bit(torch::ones({4, 4}, torch::kLong), Bnb4Type::nf4, false); })
            .starts_with("loom: quantize_4bit: bitsandbytes quantizes 16- and 32-bit floats"));
  CHECK(loom_test::error_of([] { (void)loom::peft::quantize_4bit(torch::ones({4, 4}), Bnb4Type::nf4, false, 48); })
            .starts_with("loom: quantize_4bit: blocksize 48"));
  CHECK(loom_test::error_of([] { (void)loom::peft::bnb4_type_from_name("int4", "--bnb_4bit_quant_type"); }) ==
        "loom: --bnb_4bit_quant_type: 4-bit quant type \"int4\" is not one bitsandbytes has: \"nf4\" or \"fp4\"");

  const auto dir = loom_test::fresh_dir("models/qlora_format");
  loom::checkpoint::save_safetensors(tensors, dir / "cases.safetensors", meta);
  const char* py = loom_test::python("bitsandbytes' quantize_4bit on the same weights");
  if (py == nullptr) return;
  const auto out = loom_test::run_capture(std::string(py) + " " + script() + " format " + (dir / "cases.safetensors").string() +
                                          " 2>&1; echo \"exit=$?\"");
  INFO(out);
  CHECK(out.find("6 cases, 0 differ") != std::string::npos);
  CHECK(out.find("exit=0") != std::string::npos);
}

TEST_CASE("a 4-bit layer in Conv1D's layout (fan_in_fan_out) merges its adapter into the [out, in] sum, quantized again") {
  torch::manual_seed(5);
  loom::peft::AdaptableLinear layer(64, 32, /*bias=*/false, /*fan_in_fan_out=*/true);
  auto& l = *layer;
  l.quantize_4bit(Bnb4Type::nf4, /*double_quant=*/true, torch::kFloat);
  REQUIRE(l.quantized());
  loom::peft::LoraConfig lora;
  lora.r = 4, lora.lora_alpha = 8, lora.target_modules = {"c_attn"};
  l.add_adapter(std::make_shared<const loom::peft::LoraConfig>(lora));
  {
    torch::NoGradGuard no_grad;
    l.lora_B->weight.normal_();  // an update that is not zero
  }
  // What merge_and_unload saves: the float sum in the parameter's layout, [in, out].
  const auto merged = l.merged_weight();
  REQUIRE(merged.sizes() == torch::IntArrayRef({64, 32}));
  const auto q = l.quantized_weight();
  CHECK(q.shape == std::vector<int64_t>{32, 64});  // quantized as [out, in], bitsandbytes' layout
  const auto expected = loom::peft::quantize_4bit(merged.t().contiguous().to(q.dtype), q.quant_type, q.nested(), q.blocksize);
  l.merge_adapter();
  CHECK_FALSE(l.has_adapter());
  CHECK(torch::equal(l.quantized_weight().packed, expected.packed));
  CHECK(torch::equal(l.quantized_weight().absmax, expected.absmax));
  CHECK(torch::equal(l.base_weight(torch::kFloat), loom::peft::dequantize_4bit(expected, torch::kFloat)));
}

TEST_CASE("QLoRA in the Trainer: the 4-bit base stays, resume is bitwise, PEFT over transformers' 4-bit base agrees") {
  auto model = qlora_model();
  auto& q_proj = layer(model, "model.layers.0.self_attn.q_proj");
  REQUIRE(q_proj.quantized());
  CHECK(q_proj.weight.numel() == 0);
  CHECK_FALSE(q_proj.weight.requires_grad());
  const auto packed_before = q_proj.quantized_weight().packed.clone();
  // lm_head (the output layer) stays float; every projection of both layers is 4-bit.
  const auto base = loom::peft::quantized_base(*model);
  CHECK(base.layers == 14);
  CHECK(base.values == 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128));
  CHECK(static_cast<double>(base.bytes) / static_cast<double>(base.values) < 0.52);

  const auto data = windows(48, 3);
  loom::TrainingArguments args;
  args.output_dir = loom_test::tmp_dir("qlora/train").string();
  args.disable_tqdm = true, args.use_cpu = true, args.max_steps = 6, args.per_device_train_batch_size = 4;
  args.learning_rate = 5e-3, args.logging_steps = 1, args.save_strategy = "steps", args.save_steps = 3, args.seed = 7;
  Trainer trainer(args, model, data);
  trainer.train();
  CHECK(torch::equal(q_proj.quantized_weight().packed, packed_before));
  // The memory plan counts the 4-bit bytes among the frozen ones, not float32 weights.
  REQUIRE(trainer.memory_plan().has_value());
  const double frozen = trainer.memory_plan()->frozen;
  CHECK(frozen == static_cast<double>(base.bytes) + 4.0 * (2 * 100 * 64 + 5 * 64));  // + embeddings, lm_head, norms

  std::map<std::string, torch::Tensor> adapter;
  for (const auto& p : model->named_parameters())
    if (p.key().find(".lora_") != std::string::npos) adapter[p.key()] = p.value().detach().clone();
  CHECK(adapter.size() == 8);
  auto resumed_model = qlora_model();
  auto resume_args = args;
  resume_args.resume_from_checkpoint = (fs::path(args.output_dir) / "checkpoint-3").string();
  Trainer resumed(resume_args, resumed_model, data);
  resumed.train();
  for (const auto& [name, t] : adapter) {
    CAPTURE(name);
    CHECK(torch::equal(resumed_model->named_parameters()[name], t));
  }

  const fs::path out(args.output_dir);
  trainer.save_model();
  trainer.save_merged_model();
  CHECK(q_proj.weight.numel() == 0);  // the merged save leaves the 4-bit layer as it was
  CHECK(q_proj.has_adapter());
  model->eval();
  torch::NoGradGuard no_grad;
  const auto ids = windows(2, 9).get_batch(std::vector<int64_t>{0, 1}).input_ids;
  const auto logits = model->logits(ids).contiguous();
  const auto loss = model->forward({ids, ids}).loss.reshape({1});
  loom::checkpoint::save_safetensors({{"input_ids", ids}, {"labels", ids}, {"loom_logits", logits}, {"loom_loss", loss},
                                      {"merged_logits", logits}, {"merged_loss", loss},
                                      {"q_proj_packed", q_proj.quantized_weight().packed}},
                                     out / "expected.safetensors");
  // The merged folder is a float model: loom reads it back to the adapted model's logits.
  auto merged = LlamaForCausalLM::from_pretrained(out / "merged");
  merged->eval();
  CHECK(torch::allclose(merged->logits(ids), logits, 1e-5, 1e-5));
  const char* py = loom_test::python("PEFT over transformers' 4-bit base");
  if (py == nullptr) return;
  const auto peer = loom_test::run_capture(std::string(py) + " " + script() + " model " + base_folder().string() + " " +
                                           out.string() + " " + (out / "expected.safetensors").string() +
                                           " nf4 1 2>&1; echo \"exit=$?\"");
  INFO(peer);
  CHECK(peer.find("14 Linear4bit layers") != std::string::npos);
  CHECK(peer.find("exit=0") != std::string::npos);
}

TEST_CASE("--load_in_4bit and TRL's bitsandbytes flags: the base made 4-bit under the adapter, one loom: line per mistake") {
  loom::peft::LoraArguments a;
  CHECK_FALSE(loom::peft::bnb4_config_from_args(a).has_value());
  a.bnb_4bit_quant_type = "fp4";
  CHECK(loom_test::error_of([&] { (void)loom::peft::bnb4_config_from_args(a); }) ==
        "loom: --bnb_4bit_quant_type sets up a 4-bit base, and without --load_in_4bit there is none; add --load_in_4bit "
        "or drop it");
  a.load_in_4bit = true;
  a.bnb_4bit_compute_dtype = "int8";
  CHECK(loom_test::error_of([&] { (void)loom::peft::bnb4_config_from_args(a); })
            .starts_with("loom: --bnb_4bit_compute_dtype \"int8\" is not one"));
  a.bnb_4bit_compute_dtype = "bfloat16";
  const auto c = loom::peft::bnb4_config_from_args(a);
  REQUIRE(c.has_value());
  CHECK((c->quant_type == Bnb4Type::fp4));
  CHECK((c->compute_dtype == torch::kBFloat16));
  CHECK_FALSE(c->use_double_quant);
  loom::peft::LoraArguments eight;
  eight.load_in_8bit = true;
  CHECK(loom_test::error_of([&] { (void)loom::peft::bnb4_config_from_args(eight); }).starts_with("loom: --load_in_8bit:"));

  // Without an adapter a 4-bit base cannot train: refused before anything changes.
  auto model = LlamaForCausalLM::from_pretrained(base_folder());
  CHECK(loom_test::error_of([&] { (void)loom::peft::prepare_lora(*model, a, "llama"); })
            .starts_with("loom: --load_in_4bit: a 4-bit base is frozen, so training it needs an adapter (QLoRA)"));
  CHECK(loom::peft::quantized_base(*model).layers == 0);
  // With --use_peft: quantized, then adapted; the forward computes in bfloat16 and answers in float32.
  a.use_peft = true;
  const auto adapter = loom::peft::prepare_lora(*model, a, "llama");
  REQUIRE(adapter.has_value());
  CHECK(loom::peft::quantized_base(*model).layers == 14);
  auto& v = layer(model, "model.layers.1.self_attn.v_proj");
  CHECK(v.has_adapter());
  CHECK((v.compute_dtype() == torch::kBFloat16));
  CHECK((v.lora_A->weight.scalar_type() == torch::kFloat));
  const auto ids = windows(1, 2).get_batch(std::vector<int64_t>{0}).input_ids;
  CHECK((model->logits(ids).scalar_type() == torch::kFloat));
  // Quantizing again, or a float folder read into the 4-bit model, is refused.
  CHECK(loom_test::error_of([&] { (void)loom::peft::quantize_base_4bit(*model, {}); })
            .starts_with("loom: --load_in_4bit: the model already carries a LoRA adapter"));
  loom::TrainingArguments args;
  args.output_dir = loom_test::tmp_dir("qlora/refused").string();
  args.use_cpu = true, args.max_steps = 1, args.model_name_or_path = base_folder().string();
  const auto data = windows(8, 1);
  CHECK(loom_test::error_of([&] { Trainer t(args, model, data); })
            .find("the model's base is 4-bit already, and a float folder cannot be read into it") != std::string::npos);
}

}  // namespace qlora_test
