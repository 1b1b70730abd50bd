#pragma once
// Parameters built without memory, and where their values come from: what lets a sharded run
// never hold the whole model (FSDP's meta-device initialization, DeepSpeed's zero.Init).
//
// Under a loom::DeferredInit scope, a model family that supports it (the Llama architecture's)
// registers every parameter with its shape and dtype but without storage ("storage-less").
// Nothing is allocated, nothing is drawn from the generator but one seed. The Accelerator then
// gives each parameter memory where the sharding policy keeps it: whole for a single process,
// DDP and ZeRO-1/2; only this rank's slice of each unit under FullShard (the frozen base of an
// adapter too). The values come from the model (DeferredValues):
//   - its random initialization, seeded per parameter (the model's seed and the parameter's
//     name), so any slice of it equals the same slice of the whole initialization bit for bit,
//     and the same model built without the scope is initialized identically;
//   - or the slices of the weight files that from_pretrained (under the scope) or
//     --model_name_or_path named, read straight from the files, never the whole tensor.
//
// A module may keep frozen tensors outside its parameters (ModuleState: a 4-bit layer's codes
// and absmaxes). Under the scope they are storage-less too, and materializing computes them
// from the module's parameter values (a 4-bit layer reads its whole weight and quantizes it),
// one module at a time; FullShard then keeps only this rank's shard of their bytes.
//
// A storage-less tensor is a CPU or CUDA tensor whose storage holds no bytes (numel > 0,
// nbytes 0): unlike a meta tensor it can take a parameter's place (set_data) and move between
// devices here without a copy. No arithmetic may touch it before it is materialized; the
// Trainer and Accelerator materialize before anything runs.

#include <loom/core/error.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom {

namespace detail {
inline bool& deferred_init_flag() {
  thread_local bool on = false;
  return on;
}
}  // namespace detail

/// While alive (on this thread), models of the families that support it are built with
/// storage-less parameters; the Accelerator materializes them (docs/distributed.md, "A model
/// larger than one device"). Families that do not support it refuse to be built under it.
class DeferredInit {
 public:
  DeferredInit() : previous_(detail::deferred_init_flag()) { detail::deferred_init_flag() = true; }
  ~DeferredInit() { detail::deferred_init_flag() = previous_; }
  DeferredInit(const DeferredInit&) = delete;
  DeferredInit& operator=(const DeferredInit&) = delete;
  /// True inside a DeferredInit scope on this thread.
  [[nodiscard]] static bool active() { return detail::deferred_init_flag(); }

 private:
  bool previous_;
};

/// A contiguous tensor of `sizes` and `options` whose storage holds no bytes.
inline torch::Tensor storage_less(torch::IntArrayRef sizes, const torch::TensorOptions& options) {
  auto t = torch::empty({0}, options.requires_grad(false));
  t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return t;
}

/// True for a tensor with elements but no memory behind them (built under DeferredInit, or a
/// FullShard parameter between its gathers).
inline bool holds_no_storage(const torch::Tensor& t) {
  return t.defined() && t.numel() > 0 && t.storage().nbytes() == 0;
}

/// A new parameter's tensor (float32, on the host): storage-less inside a DeferredInit scope,
/// else `value` everywhere.
inline torch::Tensor new_parameter_tensor(torch::IntArrayRef sizes, double value = 0.0) {
  if (DeferredInit::active()) return storage_less(sizes, torch::TensorOptions().dtype(torch::kFloat));
  return torch::full(sizes, value, torch::TensorOptions().dtype(torch::kFloat));
}

/// torch::nn::Linear(in, out, bias), with storage-less parameters inside a DeferredInit scope
/// (built as a 1 x 1 layer, then given its shapes: nothing of its size is allocated).
inline torch::nn::Linear new_linear(int64_t in, int64_t out, bool bias) {
  if (!DeferredInit::active()) return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
  torch::nn::Linear layer(torch::nn::LinearOptions(1, 1).bias(bias));
  layer->weight.set_data(storage_less({out, in}, layer->weight.options()));
  if (bias) layer->bias.set_data(storage_less({out}, layer->bias.options()));
  layer->options.in_features(in).out_features(out);
  return layer;
}

/// torch::nn::Embedding(count, dim), with a storage-less table inside a DeferredInit scope.
inline torch::nn::Embedding new_embedding(int64_t count, int64_t dim) {
  if (!DeferredInit::active()) return torch::nn::Embedding(count, dim);
  return torch::nn::Embedding(
      torch::nn::EmbeddingOptions(count, dim)._weight(storage_less({count, dim}, torch::TensorOptions().dtype(torch::kFloat))));
}

/// Where the values of a weight file's tensors are read from, a slice at a time.
class WeightReader {
 public:
  virtual ~WeightReader() = default;
  /// Writes elements [begin, end) of the flattened tensor the model names `name` into `out`
  /// (1-D, end - begin elements; converted to out's dtype and device).
  virtual void read(const std::string& name, int64_t begin, int64_t end, torch::Tensor& out) const = 0;
};

/// What a model built under DeferredInit answers: each parameter's initial values, a slice at
/// a time. PreTrainedModel implements it for the families that support DeferredInit.
class DeferredValues {
 public:
  virtual ~DeferredValues() = default;
  /// Writes elements [begin, end) of the flattened initial values of parameter `name` (shaped
  /// as `param`) into `out` (1-D, end - begin elements, the dtype and device it will have).
  virtual void initial_values(const std::string& name, const torch::Tensor& param, int64_t begin, int64_t end,
                              torch::Tensor& out) const = 0;
  /// The values come from `weights` (a weight file's slices) instead of the initialization.
  virtual void read_weights_from(std::shared_ptr<const WeightReader> weights) = 0;
  /// True once read_weights_from named a file.
  [[nodiscard]] virtual bool reads_weights() const = 0;
  /// The seed of the random initialization; every rank must use rank 0's (the Accelerator
  /// broadcasts it).
  [[nodiscard]] virtual uint64_t init_seed() const = 0;
  virtual void set_init_seed(uint64_t seed) = 0;
};

/// A module that keeps frozen tensors outside its parameters (peft's 4-bit layers: their base
/// weight's codes and absmaxes). Under a DeferredInit scope the tensors are storage-less and
/// their values are computed from the model's values (DeferredValues) when materialized;
/// FullShard shards them, as bytes, with the unit around the module, and gathers them with it.
class ModuleState {
 public:
  virtual ~ModuleState() = default;
  /// The tensors, each contiguous, always in the same order (storage-less until materialized).
  [[nodiscard]] virtual std::vector<torch::Tensor> state_tensors() const = 0;
  /// Computes the storage-less tensors from `values`, whose parameter names start with `prefix`
  /// (the module's name in the model), on their own device; the rest of the module is untouched.
  virtual void materialize_state(const DeferredValues& values, const std::string& prefix) = 0;
  /// Replaces the tensors by `tensors`: the same shapes and dtypes, in state_tensors' order.
  virtual void set_state_tensors(const std::vector<torch::Tensor>& tensors) = 0;
  /// The bytes materialize_state holds for a moment besides the state (what the memory plan's
  /// set-up peak adds); 0 once materialized.
  [[nodiscard]] virtual double materialize_bytes() const { return 0; }
};

/// Each ModuleState of `module` once, with its name in `module` (pre-order).
inline std::vector<std::pair<std::string, ModuleState*>> module_states(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, ModuleState*>> out;
  for (const auto& item : module.named_modules("", /*include_self=*/true))
    if (auto* s = dynamic_cast<ModuleState*>(item.value().get()))
      if (std::none_of(out.begin(), out.end(), [s](const auto& o) { return o.second == s; })) out.emplace_back(item.key(), s);
  return out;
}

/// Bytes of the ModuleState tensors of `module` (as their shapes give them, held or not).
inline double module_state_bytes(const torch::nn::Module& module) {
  double bytes = 0;
  for (const auto& [name, state] : module_states(module))
    for (const auto& t : state->state_tensors()) bytes += static_cast<double>(t.numel() * t.element_size());
  return bytes;
}

/// True when some tensor of `state` holds no storage (not materialized yet).
inline bool holds_no_storage(const ModuleState& state) {
  const auto tensors = state.state_tensors();
  return std::any_of(tensors.begin(), tensors.end(), [](const torch::Tensor& t) { return holds_no_storage(t); });
}

/// True when some parameter of `module`, or some tensor of a ModuleState in it, holds no storage.
inline bool has_storage_less_parameters(const torch::nn::Module& module) {
  for (const auto& p : module.parameters(true))
    if (holds_no_storage(p)) return true;
  for (const auto& [name, state] : module_states(module))
    if (holds_no_storage(*state)) return true;
  return false;
}

/// Makes every storage-less parameter of `module` storage-less on `device` in `dtype` (when
/// given), so that module.to(...) afterwards moves the rest and copies nothing from these.
/// Storage-less ModuleState tensors move to `device` in their own dtype.
inline void retarget_storage_less(torch::nn::Module& module, const torch::Device& device,
                                  std::optional<torch::ScalarType> dtype = std::nullopt) {
  for (auto& p : module.parameters(true)) {
    if (!holds_no_storage(p)) continue;
    const auto type = dtype && torch::isFloatingType(p.scalar_type()) ? *dtype : p.scalar_type();
    if (p.device() == device && p.scalar_type() == type) continue;
    p.set_data(storage_less(p.sizes(), p.options().device(device).dtype(type)));
  }
  for (const auto& [name, state] : module_states(module)) {
    if (!holds_no_storage(*state)) continue;
    auto tensors = state->state_tensors();
    for (auto& t : tensors) t = storage_less(t.sizes(), t.options().device(device));
    state->set_state_tensors(tensors);
  }
}

/// Gives memory and initial values (DeferredValues of `module`) to each storage-less parameter
/// of `module` that `which` accepts (all without it), on its own device and dtype.
inline void materialize(torch::nn::Module& module, const std::function<bool(const torch::Tensor&)>& which = {}) {
  const auto* values = dynamic_cast<const DeferredValues*>(&module);
  torch::NoGradGuard no_grad;
  for (auto& item : module.named_parameters(true)) {
    auto& p = item.value();
    if (!holds_no_storage(p) || (which && !which(p))) continue;
    check(values != nullptr,
          "parameter {} holds no memory, and the model gives no values for it: build the model itself under "
          "loom::DeferredInit (its parameters then come from its initialization or its weight files)", item.key());
    auto full = torch::empty({p.numel()}, p.options().requires_grad(false));
    values->initial_values(item.key(), p, 0, p.numel(), full);
    p.set_data(full.view(p.sizes()));
  }
  if (which) return;  // (a filter names parameters; module state is materialized with all of them)
  for (const auto& [name, state] : module_states(module)) {
    if (!holds_no_storage(*state)) continue;
    check(values != nullptr, "module {} holds state without memory, and the model gives no values for it: build the "
          "model itself under loom::DeferredInit", name);
    state->materialize_state(*values, name);
  }
}

}  // namespace loom
