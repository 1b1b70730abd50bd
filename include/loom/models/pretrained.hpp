#pragma once
// What every Hugging Face model family here shares, as transformers' PreTrainedModel: the
// config the model was built from, save_pretrained / load_weights on an HF folder
// (hf_folder.hpp), from_pretrained, num_parameters and the Trainer's FLOPs estimate. A family
// writes only what differs: its config struct (HF's fields, `model_type`) with a
// `validate(config, where)` and `config_shapes(config)`, its modules, and on its top module the architecture name and
// the names its files may hold beyond the parameters:
//
//   class GPT2LMHeadModelImpl : public PreTrainedModel<GPT2LMHeadModelImpl, GPT2Config, data::CausalLMBatch> {
//    public:
//     static constexpr std::string_view architecture = "GPT2LMHeadModel";  // config.json's architectures
//     explicit GPT2LMHeadModelImpl(GPT2Config config) : PreTrainedModel(std::move(config), "GPT2Config") { ... }
//     HfNameRules name_rules() const;  // tied copies, legacy buffers
//   };
//   class GPT2LMHeadModel : public torch::nn::ModuleHolder<GPT2LMHeadModelImpl> {
//     static GPT2LMHeadModel from_pretrained(const std::filesystem::path& dir) {
//       return load_pretrained<GPT2LMHeadModel>(dir);
//     }
//   };
//
// A family whose config has fields filled from others (BERT's labels) hides the static
// complete_config, which runs before every validation.

#include <loom/config/inline.hpp>
#include <loom/core/deferred.hpp>
#include <loom/core/host_memory.hpp>
#include <loom/models/hf_folder.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::models {

/// Which kernels a model's forward calls where transformers' operation-by-operation form and a
/// faster form compute the same function. Nothing here changes a file the model reads or
/// writes, or the shapes a caller sees.
///   reference  transformers' operations in its order: bitwise equal to transformers on the CPU
///   fast       fused kernels and cuBLAS-friendly shapes (the same function, rounded otherwise):
///              GPT-2's gelu_new as torch's fused tanh-approximation GELU, and the LM head's
///              products over a vocabulary padded to a multiple of 64 (logits keep vocab_size
///              columns; the padding is a zero block added in the product, not a parameter)
///   automatic  fast for CUDA tensors, reference on the CPU (the default)
enum class Kernels { automatic, reference, fast };

/// True when `kernels` asks for the fast form for a forward on `x`.
inline bool fast_kernels(Kernels kernels, const torch::Tensor& x) {
  return kernels == Kernels::fast || (kernels == Kernels::automatic && x.is_cuda());
}

namespace detail {
/// Parameters of `module`, each registered tensor once; exclude_embeddings leaves out those
/// of its torch::nn::Embedding modules (HF's num_parameters).
LOOM_INLINE int64_t count_parameters(const torch::nn::Module& module, bool exclude_embeddings);
/// Refuses (a loom::Error naming `where`) a model of `parameters` whose float32 weights (a
/// model is built in float32, then converted) exceed the host memory of one of this machine's
/// `processes` processes; nothing when the memory is unknown (0).
LOOM_INLINE void check_parameter_memory(int64_t parameters, double host_bytes, int processes, std::string_view where);
/// HF's PreTrainedModel.dtype, written to config.json: the first floating-point parameter's
/// dtype (float32 when there is none).
LOOM_INLINE torch::ScalarType weights_dtype(const torch::nn::Module& module);
/// A seed for a model's random initialization, drawn from the default CPU generator (one draw).
LOOM_INLINE uint64_t draw_init_seed();
/// The generator parameter `name` of a model seeded with `seed` is initialized from: its own,
/// seeded by (seed, name), so that its values do not depend on the other parameters.
LOOM_INLINE at::Generator parameter_generator(uint64_t seed, const std::string& name);
/// Saves the default CPU generator's state and puts it back when the scope ends: a model whose
/// initialization is seeded per parameter draws nothing else from it while its modules are built.
class KeepCpuGeneratorState {
 public:
  LOOM_INLINE KeepCpuGeneratorState();
  LOOM_INLINE ~KeepCpuGeneratorState();
  KeepCpuGeneratorState(const KeepCpuGeneratorState&) = delete;
  KeepCpuGeneratorState& operator=(const KeepCpuGeneratorState&) = delete;

 private:
  torch::Tensor state_;
};
}  // namespace detail

/// transformers' PreTrainedModel for the module `Derived` (CRTP) built from a `ConfigT` and
/// called on a `BatchT`: Derived declares `architecture` and `name_rules()`.
///
/// A family whose Derived defines `init_parameter(name, tensor, generator)` (HF's
/// _init_weights for one parameter) is initialized parameter by parameter, each from its own
/// seeded generator, and can be built under loom::DeferredInit (core/deferred.hpp): its
/// parameters then hold no memory until the Accelerator materializes them, whole or by shard.
template <class Derived, class ConfigT, class BatchT>
class PreTrainedModel : public torch::nn::Module, public DeferredValues {
 public:
  using Config = ConfigT;  ///< the family's config struct (config.json)
  using Batch = BatchT;    ///< what forward(batch) takes

  /// The config, completed and validated.
  [[nodiscard]] const Config& config() const { return config_; }

  /// Parameters, counted once (tied ones once); exclude_embeddings leaves out the embedding
  /// tables (torch::nn::Embedding modules), as HF's num_parameters.
  [[nodiscard]] int64_t num_parameters(bool exclude_embeddings = false) const {
    return detail::count_parameters(*this, exclude_embeddings);
  }
  /// transformers.Trainer's FLOPs estimate (total_flos): 6 x tokens x non-embedding parameters.
  [[nodiscard]] double floating_point_ops(const Batch& batch) const {
    return 6.0 * static_cast<double>(batch.input_ids.numel()) * static_cast<double>(num_parameters(true));
  }

  /// Writes config.json and the weights (model.safetensors, or shards with an index).
  void save_pretrained(const std::filesystem::path& dir, const SaveOptions& options = {}) const {
    save_hf_weights(*this, dir, options);
    models::detail::write_sorted_json(hf_config(), dir / config_file);
  }
  /// config.json's object as save_pretrained writes it; the Trainer writes it beside the
  /// weights of save_model and of every checkpoint, so transformers opens them.
  [[nodiscard]] nlohmann::json hf_config() const {
    return hf_config_json(config_, architecture_name(), detail::weights_dtype(*this));
  }
  /// Reads the weights of an HF folder into this model (same config), strictly, allowing the
  /// family's name_rules().
  void load_weights(const std::filesystem::path& dir) {
    load_hf_weights(*this, dir, static_cast<const Derived&>(*this).name_rules());
  }

  /// config.json's architectures entry: Derived::architecture, or what a family serving
  /// several HF classes (Llama, Qwen2, Mistral) answers for its config.
  [[nodiscard]] std::string_view architecture_name() const {
    if constexpr (requires { Derived::architecture; }) return Derived::architecture;
    else return static_cast<const Derived&>(*this).architecture_name();
  }

  // ---- DeferredValues: the values of parameters built without memory --------------------
  void initial_values(const std::string& name, const torch::Tensor& param, int64_t begin, int64_t end,
                      torch::Tensor& out) const override {
    if (weights_) {
      weights_->read(name, begin, end, out);
      return;
    }
    if constexpr (seeded_per_parameter()) {
      torch::NoGradGuard no_grad;
      // The whole parameter (one at a time, on the host), then the slice asked for.
      auto full = torch::empty(param.sizes(), torch::TensorOptions().dtype(torch::kFloat));
      static_cast<const Derived&>(*this).init_parameter(name, full, detail::parameter_generator(init_seed_, name));
      out.copy_(full.reshape({-1}).narrow(0, begin, end - begin));
    } else {
      fail("parameter {} holds no memory, and {} has no per-parameter initialization to give it values", name,
           architecture_name());
    }
  }
  void read_weights_from(std::shared_ptr<const WeightReader> weights) override { weights_ = std::move(weights); }
  [[nodiscard]] bool reads_weights() const override { return weights_ != nullptr; }
  [[nodiscard]] uint64_t init_seed() const override { return init_seed_; }
  void set_init_seed(uint64_t seed) override { init_seed_ = seed; }

  /// Fills the config's fields that follow from others before validation (none here; a
  /// family hides it with its own).
  static void complete_config(Config& /*config*/) {}

  /// The parameters a model of `config` has, counted before it is built: Derived's static
  /// parameter_count(config) (a head other than the family's), else the family's free
  /// parameter_count(config); none when the family has no count.
  static std::optional<int64_t> parameters_for(const Config& config) {
    if constexpr (requires { { Derived::parameter_count(config) } -> std::convertible_to<int64_t>; })
      return Derived::parameter_count(config);
    else if constexpr (requires { { parameter_count(config) } -> std::convertible_to<int64_t>; })
      return parameter_count(config);
    else
      return std::nullopt;
  }

 protected:
  /// Keeps `config`, completed and validated (`validate(config, where)` of the family).
  PreTrainedModel(Config config, std::string_view where) : config_(std::move(config)) {
    Derived::complete_config(config_);
    validate(config_, where);
    if constexpr (seeded_per_parameter()) init_seed_ = detail::draw_init_seed();
    if (DeferredInit::active()) {
      // The memory plan judges what each rank will hold once the Accelerator has sharded it.
      check(seeded_per_parameter(), "{} cannot be built under loom::DeferredInit: only the families initialized "
            "parameter by parameter can (the Llama architecture's)", where);
      return;
    }
    if (const auto n = Derived::parameters_for(config_))
      detail::check_parameter_memory(*n, host_memory_bytes(), local_processes(), where);
  }

  /// Derived's random initialization, parameter by parameter (eager construction): every
  /// parameter from its own generator, as initial_values gives a deferred one.
  void init_seeded_parameters() {
    if (DeferredInit::active()) return;  // storage-less: materialized later
    torch::NoGradGuard no_grad;
    for (auto& item : this->named_parameters(true))
      static_cast<const Derived&>(*this).init_parameter(item.key(), item.value(),
                                                        detail::parameter_generator(init_seed_, item.key()));
  }

  Config config_;

 private:
  // Evaluated where Derived is complete (a member function's body, not the class's).
  static constexpr bool seeded_per_parameter() {
    return requires(const Derived& d, torch::Tensor& t, at::Generator g) { d.init_parameter(std::string(), t, g); };
  }
  std::shared_ptr<const WeightReader> weights_;  // from_pretrained or --model_name_or_path under DeferredInit
  uint64_t init_seed_ = 0;
};

/// HF's from_pretrained for `Model`, a module holder of a PreTrainedModel: config.json read
/// into its Config, completed and validated (errors name the file), the shapes the config
/// gives (the family's config_shapes) compared with the weight files' headers, the model built from it,
/// then the weights (model.safetensors or sharded) read into it strictly, in `dtype` (HF's
/// torch_dtype: float32 by default, as HF's; bfloat16 or float16 to train or run in them).
/// `adjust`, when given, changes the config read before it is completed (transformers'
/// from_pretrained(..., num_labels=N)).
template <class Model>
Model load_pretrained(const std::filesystem::path& dir, torch::ScalarType dtype = torch::kFloat,
                      const std::function<void(typename Model::ContainedType::Config&)>& adjust = {}) {
  using Impl = typename Model::ContainedType;
  auto config = read_hf_config<typename Impl::Config>(dir);
  if (adjust) adjust(config);
  Impl::complete_config(config);
  validate(config, (dir / config_file).string());
  // The shapes the config gives (the model's own config_shapes when its head differs from
  // the family's), compared before anything is allocated.
  std::vector<ConfigShape> shapes;
  if constexpr (requires { Impl::config_shapes(config); }) shapes = Impl::config_shapes(config);
  else shapes = config_shapes(config);
  check_config_shapes(dir, shapes, (dir / config_file).string());
  Model model(std::move(config));
  // The parameters in the dtype asked for; the files' tensors (float32, bf16, fp16) are
  // converted to it as they are copied in.
  check(torch::isFloatingType(dtype), "from_pretrained: dtype must be a floating-point type, got {}",
        c10::toString(dtype));
  if (dtype != torch::kFloat) {
    retarget_storage_less(*model, torch::kCPU, dtype);  // a DeferredInit model's stay storage-less
    model->to(dtype);
  }
  model->load_weights(dir);
  return model;
}

}  // namespace loom::models

#if defined(LOOM_HEADER_ONLY)
#include <loom/models/impl/pretrained.ipp>
#endif
