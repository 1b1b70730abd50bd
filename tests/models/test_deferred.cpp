// Models built without memory (loom::DeferredInit, core/deferred.hpp): a Llama-architecture
// model built under the scope holds no parameter memory; materialized, whole or a slice at a
// time, it holds exactly what the same model built eagerly holds, from its seeded
// initialization or from its HF folder (sharded, or read into bfloat16); a 4-bit base under
// it is quantized as it is materialized, to the eager base's bytes; the Trainer trains it (and
// QLoRA on it) as the eager model, under a single process and under FullShard; families that
// cannot defer say so.

#include <loom/loom.hpp>
#include <loom/models/gpt2.hpp>
#include <loom/models/llama.hpp>

#include <doctest/doctest.h>

#include "../support.hpp"

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace deferred_test {

namespace fs = std::filesystem;
using loom::data::CausalLMBatch;
using loom::models::LlamaConfig;
using loom::models::LlamaForCausalLM;

inline LlamaConfig tiny(const std::string& model_type = "llama") {
  LlamaConfig c;
  c.model_type = model_type;
  c.vocab_size = 100, c.hidden_size = 48, c.intermediate_size = 96, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = 64;
  c.bos_token_id = 0, c.eos_token_id = 1, c.pad_token_id = 2;
  c.tie_word_embeddings = false;
  return c;
}

inline std::map<std::string, torch::Tensor> state_of(const torch::nn::Module& m) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

inline void check_equal_states(const torch::nn::Module& a, const torch::nn::Module& b) {
  const auto sa = state_of(a), sb = state_of(b);
  REQUIRE(sa.size() == sb.size());
  for (const auto& [name, t] : sa) {
    CAPTURE(name);
    REQUIRE(sb.contains(name));
    CHECK((t.scalar_type() == sb.at(name).scalar_type()));
    CHECK(torch::equal(t, sb.at(name)));
  }
}

inline int64_t storage_less_count(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += loom::holds_no_storage(p) ? 1 : 0;
  return n;
}

// Every parameter's values read back in three uneven slices equal the whole's.
inline void check_slices(const LlamaForCausalLM& deferred, const torch::nn::Module& eager) {
  const auto want = state_of(eager);
  for (const auto& item : deferred->named_parameters()) {
    CAPTURE(item.key());
    const auto& p = item.value();
    const auto flat = want.at(item.key()).reshape({-1});
    const int64_t n = p.numel(), cut1 = n / 3, cut2 = n / 3 + n / 2;
    for (const auto& [a, e] : std::vector<std::pair<int64_t, int64_t>>{{0, cut1}, {cut1, cut2}, {cut2, n}}) {
      auto out = torch::empty({e - a}, flat.options());
      deferred->initial_values(item.key(), p, a, e, out);
      CHECK(torch::equal(out, flat.narrow(0, a, e - a)));
    }
  }
}

TEST_CASE("a Llama-architecture model under DeferredInit holds no parameter memory, and materializes to the eager model bit for bit") {
  for (const std::string type : {"llama", "qwen2", "gemma", "gemma2", "gemma3_text", "mixtral", "qwen3_moe"}) {
    CAPTURE(type);
    torch::manual_seed(21);
    LlamaForCausalLM eager(tiny(type));
    const auto after_eager = torch::rand({4});  // the default generator after the build
    torch::manual_seed(21);
    std::optional<LlamaForCausalLM> lazy;
    {
      const loom::DeferredInit scope;
      CHECK(loom::DeferredInit::active());
      lazy.emplace(tiny(type));
    }
    CHECK_FALSE(loom::DeferredInit::active());
    const auto after_lazy = torch::rand({4});
    // One draw (the seed) in both: what follows the build (an adapter's init, dropout) is the same.
    CHECK(torch::equal(after_eager, after_lazy));
    const int64_t params = static_cast<int64_t>((*lazy)->parameters().size());
    CHECK(storage_less_count(**lazy) == params);
    CHECK((*lazy)->num_parameters() == eager->num_parameters());
    check_slices(*lazy, *eager);
    loom::materialize(**lazy);
    CHECK(storage_less_count(**lazy) == 0);
    check_equal_states(**lazy, *eager);
    // The initialization is HF's: normal(0, 0.02) weights, the padding row 0, norms 1 (Gemma's 0).
    const auto& emb = eager->model->embed_tokens->weight;
    CHECK(torch::equal(emb[2], torch::zeros({48})));
    CHECK(std::abs(emb.std().item<double>() - 0.02) < 0.002);
    CHECK(torch::equal(eager->model->norm->weight, torch::full({48}, type.starts_with("gemma") ? 0.0 : 1.0)));
    // And the same model gives the same logits.
    const auto ids = torch::randint(3, 100, {2, 7});
    CHECK(torch::equal((*lazy)->logits(ids), eager->logits(ids)));
  }
}

TEST_CASE("from_pretrained under DeferredInit reads slices of the folder's files: one file, HF's shards, into bfloat16") {
  torch::manual_seed(3);
  LlamaForCausalLM eager(tiny());
  const auto dir = loom_test::fresh_dir("models/deferred");
  eager->save_pretrained(dir / "whole");
  eager->save_pretrained(dir / "sharded", {.max_shard_size = 20'000});
  REQUIRE(fs::exists(dir / "sharded" / "model.safetensors.index.json"));
  for (const std::string folder : {"whole", "sharded"}) {
    CAPTURE(folder);
    std::optional<LlamaForCausalLM> lazy;
    {
      const loom::DeferredInit scope;
      lazy.emplace(LlamaForCausalLM::from_pretrained(dir / folder));
    }
    CHECK((*lazy)->reads_weights());
    CHECK(storage_less_count(**lazy) == static_cast<int64_t>((*lazy)->parameters().size()));
    check_slices(*lazy, *eager);
    loom::materialize(**lazy);
    check_equal_states(**lazy, *eager);
  }
  // Read into bfloat16: storage-less bfloat16 parameters, then the file's values rounded as
  // the eager from_pretrained rounds them.
  const auto eager_bf16 = LlamaForCausalLM::from_pretrained(dir / "sharded", torch::kBFloat16);
  std::optional<LlamaForCausalLM> lazy;
  {
    const loom::DeferredInit scope;
    lazy.emplace(LlamaForCausalLM::from_pretrained(dir / "sharded", torch::kBFloat16));
  }
  for (const auto& p : (*lazy)->parameters()) CHECK((p.scalar_type() == torch::kBFloat16));
  loom::materialize(**lazy);
  check_equal_states(**lazy, *eager_bf16);
  // A folder that does not match is refused before anything is read, as eagerly.
  auto other = tiny();
  other.intermediate_size = 64;
  const loom::DeferredInit scope;
  CHECK_THROWS_WITH_AS(LlamaForCausalLM(other)->load_weights(dir / "sharded"),
                       doctest::Contains("shape of model.layers.0.mlp.down_proj.weight"), loom::Error);
}

TEST_CASE("families without a per-parameter initialization refuse DeferredInit") {
  const loom::DeferredInit scope;
  loom::models::GPT2Config g;
  g.vocab_size = 50, g.n_positions = 16, g.n_embd = 16, g.n_layer = 1, g.n_head = 2;
  CHECK_THROWS_WITH_AS(loom::models::GPT2LMHeadModel{g}, doctest::Contains("cannot be built under loom::DeferredInit"),
                       loom::Error);
}

// Each 4-bit layer's state (codes, absmaxes, nested absmaxes, offset) of `a` equals `b`'s, byte for byte.
inline void check_equal_4bit(const torch::nn::Module& a, const torch::nn::Module& b) {
  const auto la = loom::peft::adaptable_layers(a), lb = loom::peft::adaptable_layers(b);
  REQUIRE(la.size() == lb.size());
  for (std::size_t i = 0; i < la.size(); ++i) {
    CAPTURE(la[i].first);
    const auto ta = la[i].second->state_tensors(), tb = lb[i].second->state_tensors();
    REQUIRE(ta.size() == tb.size());
    for (std::size_t j = 0; j < ta.size(); ++j) CHECK(torch::equal(ta[j], tb[j]));
  }
}

TEST_CASE("a 4-bit base under DeferredInit is quantized as it is materialized, layer by layer: the eager base's bytes") {
  for (const bool nested : {false, true}) {
    CAPTURE(nested);
    const loom::peft::Bnb4Config config{loom::peft::Bnb4Type::nf4, nested, torch::kFloat};
    torch::manual_seed(5);
    LlamaForCausalLM eager(tiny());
    const int layers = loom::peft::quantize_base_4bit(*eager, config);
    torch::manual_seed(5);
    std::optional<LlamaForCausalLM> lazy;
    {
      const loom::DeferredInit scope;
      lazy.emplace(tiny());
    }
    CHECK(loom::peft::quantize_base_4bit(**lazy, config) == layers);
    // Sizes known before any value: what the memory plan counts.
    CHECK(loom::peft::quantized_base(**lazy).bytes == loom::peft::quantized_base(*eager).bytes);
    CHECK(loom::module_state_bytes(**lazy) == static_cast<double>(loom::peft::quantized_base(*eager).bytes));
    for (const auto& [name, layer] : loom::peft::adaptable_layers(**lazy))
      if (layer->quantized()) CHECK(loom::holds_no_storage(*layer));
    CHECK(loom::has_storage_less_parameters(**lazy));
    loom::materialize(**lazy);
    CHECK_FALSE(loom::has_storage_less_parameters(**lazy));
    check_equal_4bit(**lazy, *eager);
    const auto ids = torch::randint(3, 100, {2, 7});
    CHECK(torch::equal((*lazy)->logits(ids), eager->logits(ids)));
  }
}

// Windows of 16 random tokens (own generator).
inline loom::data::TensorDataset<CausalLMBatch> windows(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto ids = torch::randint(3, 100, {n, 16}, gen);
  return loom::data::TensorDataset<CausalLMBatch>({ids, ids.clone()});
}

inline loom::TrainingArguments args_for(const std::string& name) {
  loom::TrainingArguments a;
  a.output_dir = loom_test::fresh_dir(name).string();
  a.disable_tqdm = true;
  a.use_cpu = true;
  a.max_steps = 4;
  a.per_device_train_batch_size = 4;
  a.learning_rate = 5e-3;
  a.logging_steps = 1;
  a.save_strategy = "no";
  a.seed = 7;
  return a;
}

struct ShardedTrainer : loom::Trainer<ShardedTrainer, LlamaForCausalLM, loom::sharding::FullShard> {
  using loom::Trainer<ShardedTrainer, LlamaForCausalLM, loom::sharding::FullShard>::Trainer;
};

template <class T>
std::vector<double> train_losses(T& trainer) {
  trainer.train();
  std::vector<double> out;
  for (const auto& entry : trainer.state().log_history)
    if (entry.contains("loss")) out.push_back(entry.at("loss").template get<double>());
  CHECK(out.size() == 4);
  return out;
}

// QLoRA's base and adapter: nested NF4 under LoRA r 4 on q_proj and v_proj.
inline void make_qlora(torch::nn::Module& model) {
  loom::peft::quantize_base_4bit(model, {loom::peft::Bnb4Type::nf4, true, torch::kFloat});
  loom::peft::LoraConfig lora;
  lora.r = 4, lora.lora_alpha = 8, lora.target_modules = {"q_proj", "v_proj"};
  loom::peft::apply_lora(model, lora);
}

template <class T>
void check_trains_as_eager(const std::string& name, bool from_folder, bool qlora = false) {
  const auto data = windows(32, 4);
  const auto dir = loom_test::fresh_dir("models/deferred_" + name);
  torch::manual_seed(8);
  LlamaForCausalLM eager(tiny());
  if (from_folder) eager->save_pretrained(dir / "base");
  if (qlora) make_qlora(*eager);
  auto eager_args = args_for("models/deferred_" + name + "/eager");
  T eager_trainer(eager_args, eager, data);
  const auto want = train_losses(eager_trainer);

  torch::manual_seed(8);
  std::optional<LlamaForCausalLM> lazy;
  {
    const loom::DeferredInit scope;
    lazy.emplace(from_folder ? LlamaForCausalLM::from_pretrained(dir / "base") : LlamaForCausalLM(tiny()));
  }
  if (qlora) make_qlora(**lazy);  // the 4-bit tensors hold no memory yet
  auto lazy_args = args_for("models/deferred_" + name + "/lazy");
  T lazy_trainer(lazy_args, *lazy, data);
  constexpr bool sharded = std::is_same_v<T, ShardedTrainer>;
  // The Trainer materialized every parameter (FullShard's stay released between its gathers).
  if constexpr (!sharded) CHECK(storage_less_count(**lazy) == 0);
  const auto got = train_losses(lazy_trainer);
  REQUIRE(want.size() == 4);
  CHECK(got == want);
  if (qlora) {
    // The 4-bit bytes of the eager base (FullShard in a world of one: its shard is the whole
    // unit, which the layers show), counted by the engine; the merged folders alike, bitwise
    // (FullShard's written unit by unit).
    check_equal_4bit(**lazy, *eager);
    const auto base = loom::peft::quantized_base(*eager);
    const double held = lazy_trainer.model_state_bytes().module_state;  // (each tensor at a multiple of 4 bytes)
    CHECK(held >= static_cast<double>(base.bytes));
    CHECK(held < static_cast<double>(base.bytes + 4 * 3 * base.layers));
    eager_trainer.save_merged_model((dir / "merged_eager").string());
    lazy_trainer.save_merged_model((dir / "merged_lazy").string());
    const auto a = loom::checkpoint::load_safetensors(dir / "merged_eager" / "model.safetensors");
    const auto b = loom::checkpoint::load_safetensors(dir / "merged_lazy" / "model.safetensors");
    std::map<std::string, torch::Tensor> mb(b.begin(), b.end());
    REQUIRE(a.size() == mb.size());
    CHECK(a.size() == eager->named_parameters().size() - 8 + eager->named_buffers().size());  // no adapter tensor
    for (const auto& [key, t] : a) {
      CAPTURE(key);
      REQUIRE(mb.contains(key));
      CHECK((t.scalar_type() == torch::kFloat));
      CHECK(torch::equal(t, mb.at(key)));
    }
    return;
  }
  // And --model_name_or_path read into a deferred model: the same weights.
  if (from_folder && !sharded) {
    fs::create_directories(dir / "loom_model");
    loom::checkpoint::save_module(*eager_trainer.model(), dir / "loom_model" / "model.safetensors");
    torch::manual_seed(8);
    std::optional<LlamaForCausalLM> again;
    {
      const loom::DeferredInit scope;
      again.emplace(tiny());
    }
    auto args = args_for("models/deferred_" + name + "/path");
    args.model_name_or_path = (dir / "loom_model").string();
    T trainer(args, *again, data);
    CHECK((*again)->reads_weights());
    check_equal_states(**again, *eager_trainer.model());
  }
}

TEST_CASE("the Trainer trains a model built under DeferredInit as the eager one, bitwise: one process and FullShard") {
  SUBCASE("no sharding, random init") { check_trains_as_eager<loom::DefaultTrainer<LlamaForCausalLM>>("plain", false); }
  SUBCASE("no sharding, from a folder") { check_trains_as_eager<loom::DefaultTrainer<LlamaForCausalLM>>("plain_folder", true); }
  SUBCASE("FullShard, random init") { check_trains_as_eager<ShardedTrainer>("full_shard", false); }
  SUBCASE("FullShard, from a folder") { check_trains_as_eager<ShardedTrainer>("full_shard_folder", true); }
  SUBCASE("QLoRA, no sharding, from a folder") {
    check_trains_as_eager<loom::DefaultTrainer<LlamaForCausalLM>>("qlora_plain_folder", true, true);
  }
  SUBCASE("QLoRA, FullShard, random init") { check_trains_as_eager<ShardedTrainer>("qlora_full_shard", false, true); }
}

}  // namespace deferred_test
