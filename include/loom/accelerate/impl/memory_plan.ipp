#pragma once
#include <loom/config/validate.hpp>
#include <loom/core/deferred.hpp>
#include <loom/core/error.hpp>
#include <loom/core/host_memory.hpp>
#include <loom/distributed/engine.hpp>
#include <loom/distributed/full_shard_unit.hpp>
#include <loom/optim/catalog.hpp>
#include <loom/optim/optimizer.hpp>
#include <loom/policy/catalog.hpp>
#include <loom/accelerate/memory_plan.hpp>

#if __has_include(<ATen/cuda/CUDAContext.h>) && __has_include(<cuda_runtime_api.h>)
#include <ATen/cuda/CUDAContext.h>
#define LOOM_MEMORY_PLAN_CUDA 1
#endif

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <unordered_map>

namespace loom {

namespace detail {
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace detail

LOOM_INLINE MemoryPlan make_memory_plan(const MemoryPlanInputs& in) {
  MemoryPlan plan;
  const auto& f = in.sharding;
  const int64_t n = std::max(in.world, 1);
  plan.world = static_cast<int>(n);
  plan.sharding = std::string(f.name);
  plan.activations = in.activations;
  plan.activation_note = in.activation_note;
  double whole = 0, largest = 0, transient = 0;  // the model as built (its parameters' bytes), its largest parameter
  for (const auto& p : in.params) {
    const auto bytes = static_cast<double>(p.numel * p.element_size);
    whole += bytes;
    largest = std::max(largest, bytes + p.materialize);
    transient = std::max(transient, p.materialize);
  }
  std::map<int, int64_t> unit_numel;  // FullShard: trainable elements per unit
  std::map<std::pair<int, int64_t>, int64_t> frozen_numel;  // FullShard: frozen elements per (unit, element size)
  double optimizer = 0, piece_bytes = 0;
  for (const auto& p : in.params) {
    const auto whole = static_cast<double>(p.numel * p.element_size);
    if (!p.trainable) {
      if (f.shards_parameters && p.shardable) frozen_numel[{p.unit, p.element_size}] += p.numel;
      else plan.frozen += whole;
      continue;
    }
    const auto piece = static_cast<double>(detail::ceil_div(p.numel, n) * p.element_size);
    if (f.shards_parameters) unit_numel[p.unit] += p.numel;
    else {
      plan.params += whole;
      plan.grads += f.shards_gradients ? piece : whole;
    }
    optimizer += f.shards_optimizer_state ? p.state_piece : p.state_whole;
    piece_bytes += f.shards_optimizer_state ? piece : whole;
  }
  if (f.shards_parameters) {
    // Each unit: a float32 shard of round_up(numel, N) / N elements and its gradient shard;
    // gathered in the gather dtype around its forward and backward. Its frozen parameters: a
    // shard of their own per dtype, gathered beside (float32 ones in the gather dtype).
    // A flat buffer in a world of one, not offloaded, gathered in its own dtype is its shard.
    const bool one = n == 1 && !in.offload_param;
    std::map<int, double> gathered;  // per unit
    for (const auto& [unit, numel] : unit_numel) {
      const int64_t padded = detail::ceil_div(numel, n) * n;
      const auto shard = static_cast<double>(padded / n * 4);
      (in.offload_param ? plan.host : plan.params) += shard;
      plan.grads += shard;
      if (!(one && in.gather_element_size == 4)) gathered[unit] += static_cast<double>(padded * in.gather_element_size);
    }
    for (const auto& [key, numel] : frozen_numel) {
      const auto [unit, size] = key;
      const int64_t padded = detail::ceil_div(numel, n) * n;
      (in.offload_param ? plan.host : plan.frozen) += static_cast<double>(padded / n * size);
      const int64_t gather_size = size == 4 ? in.gather_element_size : size;
      if (!(one && gather_size == size)) gathered[unit] += static_cast<double>(padded * gather_size);
    }
    double root = 0, largest = 0;
    for (const auto& [unit, bytes] : gathered) {
      if (unit == 0) root = bytes;
      else largest = std::max(largest, bytes);
    }
    // The unit in use, and the next one beside it when a prefetch is on.
    plan.gathered = (in.prefetch ? 2 : 1) * largest + root;
  }
  // Set-up: the engine's parameters, and its gradients except under FullShard (whose gradient
  // shards come with the first reduction), beside them under FullShard the model whole as
  // built until it is sharded, or, built under loom::DeferredInit, the one parameter being
  // materialized (drawn whole on the host, then sliced; a 4-bit layer's float weight while it
  // is quantized, which the other policies hold for a moment too). (The bucket engines'
  // staging copy, one bucket, is transient as in training.)
  plan.setup = plan.params + plan.frozen +
               (f.shards_parameters ? (in.deferred ? largest : whole) : plan.grads + (in.deferred ? transient : 0));
  if (in.offload_optimizer) {
    // The step runs on host copies: the state, each piece's gradient, and the piece itself
    // unless it lives on the host already (--offload_param).
    plan.host += optimizer + piece_bytes + (in.offload_param ? 0 : piece_bytes);
  } else {
    plan.optimizer = optimizer;
  }
  return plan;
}

LOOM_INLINE std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int k = 0;
  while (bytes >= 1024 && k < 4) {
    bytes /= 1024;
    ++k;
  }
  return k == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.2f} {}", bytes, units[k]);
}

LOOM_INLINE std::optional<std::string> memory_plan_refusal(const MemoryPlan& plan, double capacity, bool device_is_host) {
  const double total = plan.device_total() + (device_is_host ? plan.host : 0);
  const double setup = plan.setup + (device_is_host ? plan.host : 0);
  if (capacity <= 0 || std::max(total, setup) <= capacity) return std::nullopt;
  if (total <= capacity)
    return fmt::format(
        "the memory plan's set-up peak needs {} per process (the model whole as built beside this rank's shards) but "
        "the {} has {}, although training needs {}: build the model under loom::DeferredInit (each rank then "
        "materializes only its shards, docs/distributed.md); --skip_memory_check starts anyway",
        format_bytes(setup), device_is_host ? "CPU share of this process" : "device", format_bytes(capacity),
        format_bytes(total));
  // Frozen parameters (a base under an adapter) larger than the trainable state: only the
  // policies that shard parameters shrink them; otherwise every policy sharding optimizer state.
  const bool frozen_heavy = plan.frozen > plan.params + plan.grads + plan.optimizer;
  const std::string shard_more =
      frozen_heavy
          ? fmt::format("shard the frozen parameters (--sharding {}: no other policy shards them)",
                        names_where<ShardingCatalog>([](const ShardingFacts& f) { return f.shards_parameters; }, " / ", " / "))
          : fmt::format("shard more (--sharding {})",
                        names_where<ShardingCatalog>([](const ShardingFacts& f) { return f.shards_optimizer_state; }, " / ",
                                                     " / "));
  return fmt::format(
      "the memory plan needs {} per process ({}parameters {}, gradients {}, optimizer state {}, gathered units {}, "
      "activations {}{}) but the {} has {}: {}, offload "
      "(--offload_optimizer, --offload_param), lower --per_device_train_batch_size or turn on "
      "--gradient_checkpointing; --skip_memory_check starts anyway",
      format_bytes(total), plan.frozen > 0 ? "frozen parameters " + format_bytes(plan.frozen) + ", " : std::string(),
      format_bytes(plan.params), format_bytes(plan.grads), format_bytes(plan.optimizer), format_bytes(plan.gathered),
      plan.activations ? format_bytes(*plan.activations) : std::string("unknown"),
      device_is_host && plan.host > 0 ? ", host " + format_bytes(plan.host) : std::string(),
      device_is_host ? "CPU share of this process" : "device", format_bytes(capacity), shard_more);
}

LOOM_INLINE std::string format_memory_plan(const MemoryPlan& plan) {
  std::string out = fmt::format("memory plan per rank (--sharding {}, {} rank{}):\n", plan.sharding, plan.world,
                                plan.world == 1 ? "" : "s");
  const auto line = [&out](std::string_view what, const std::string& value, const std::string& note = {}) {
    out += fmt::format("  {:<18}{:>12}{}\n", what, value, note.empty() ? note : "  (" + note + ")");
  };
  line("parameters", format_bytes(plan.params));
  if (plan.frozen > 0) line("frozen parameters", format_bytes(plan.frozen));
  line("gradients", format_bytes(plan.grads));
  line("optimizer state", format_bytes(plan.optimizer));
  if (plan.gathered > 0) line("gathered units", format_bytes(plan.gathered));
  if (plan.activations) line("activations", format_bytes(*plan.activations), plan.activation_note);
  else
    line("activations", "unknown",
         plan.activation_note.empty() ? "no estimate for this model / sequence length" : plan.activation_note);
  line("device total", format_bytes(plan.device_total()));
  if (plan.setup > 0) line("set-up peak", format_bytes(plan.setup), "while the model is prepared");
  if (plan.host > 0) line("host", format_bytes(plan.host));
  out.pop_back();
  return out;
}

namespace detail {
inline double state_bytes_of(const optim::Rule* rule, const optim::OptimizerOptions& options, at::IntArrayRef shape) {
  if (rule == nullptr) return 0;
  double bytes = 0;
  const auto meta = torch::empty(shape, torch::TensorOptions().device(torch::kMeta));
  for (const auto& [kind, t] : rule->initial_state(meta, options)) bytes += static_cast<double>(t.nbytes());
  return bytes;
}
}  // namespace detail

LOOM_INLINE MemoryPlanInputs memory_plan_inputs(const torch::nn::Module& module, const TrainingArguments& args,
                                                const ShardingFacts& sharding, int world) {
  MemoryPlanInputs in;
  in.sharding = sharding;
  in.world = std::max(world, 1);
  in.gather_element_size = sharding.shards_parameters ? c10::elementSize(dist::sharding_dtype(args.sharding_param_dtype)) : 4;
  in.offload_optimizer = args.offload_optimizer;
  in.offload_param = args.offload_param;
  in.prefetch = args.fsdp_forward_prefetch || args.fsdp_backward_prefetch != loom::detail::kBackwardPrefetch[0];
  in.deferred = has_storage_less_parameters(module);
  // FullShard's units, chosen as the engine chooses them (each parameter in its innermost unit).
  std::unordered_map<const c10::TensorImpl*, int> unit_of;
  std::unordered_map<const torch::nn::Module*, int> module_unit;
  int units = 0;
  for (const auto& c : dist::unit_candidates(module, loom::detail::wrap_classes_of(args), args.fsdp_min_num_params)) {
    if (!c.chosen) continue;
    ++units;
    for (const auto& p : c.module->parameters(true)) unit_of[p.unsafeGetTensorImpl()] = units;
    for (const auto& m : c.module->modules(/*include_self=*/true)) module_unit[m.get()] = units;
  }
  const auto options = optim::options_from_args(args);
  const optim::Rule* rule = optim::find_rule(options.algorithm);
  for (const auto& p : module.parameters(true)) {
    MemoryPlanInputs::Param q;
    q.numel = p.numel();
    q.element_size = static_cast<int64_t>(p.element_size());
    q.trainable = p.requires_grad();
    q.shardable = q.trainable || p.is_floating_point();  // as the engine keeps a frozen integer tensor whole
    const auto u = unit_of.find(p.unsafeGetTensorImpl());
    q.unit = u == unit_of.end() ? 0 : u->second;
    if (q.trainable) {
      q.state_whole = detail::state_bytes_of(rule, options, p.sizes());
      q.state_piece = detail::state_bytes_of(rule, options, {detail::ceil_div(q.numel, in.world)});
    }
    in.params.push_back(q);
  }
  // Modules' frozen state (a 4-bit base's codes and absmaxes, QLoRA): bytes, frozen, in the
  // unit of their module; FullShard shards them with it (its bytes buffer, padded per tensor to 4
  // bytes, which the plan leaves out).
  for (const auto& [name, state] : module_states(module)) {
    MemoryPlanInputs::Param q;
    for (const auto& t : state->state_tensors()) q.numel += t.numel() * static_cast<int64_t>(t.element_size());
    if (q.numel == 0) continue;
    q.element_size = 1;
    q.trainable = false;
    q.materialize = state->materialize_bytes();
    const auto u = module_unit.find(dynamic_cast<const torch::nn::Module*>(state));
    q.unit = u == module_unit.end() ? 0 : u->second;
    in.params.push_back(q);
  }
  return in;
}

LOOM_INLINE double device_memory_bytes(const torch::Device& device, int local_processes) {
  if (device.is_cuda()) {
#ifdef LOOM_MEMORY_PLAN_CUDA
    const int index = device.has_index() ? device.index() : 0;
    return static_cast<double>(at::cuda::getDeviceProperties(index)->totalGlobalMem);
#else
    return 0;  // unknown: no check
#endif
  }
  if (!device.is_cpu()) return 0;
  return host_memory_bytes() / std::max(local_processes, 1);
}

}  // namespace loom
