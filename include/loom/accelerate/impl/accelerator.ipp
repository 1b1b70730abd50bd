#pragma once
#include <loom/config/json.hpp>
#include <loom/config/text.hpp>
#include <loom/config/validate.hpp>
#include <loom/core/deferred.hpp>
#include <loom/core/fused_gradients.hpp>
#include <loom/core/log.hpp>
#include <loom/distributed/checkpointed.hpp>
#include <loom/distributed/comm.hpp>
#include <loom/accelerate/accelerator.hpp>
#include <loom/accelerate/evaluation.hpp>
#include <loom/metrics/memory.hpp>  // LOOM_HAS_CUDA_ALLOCATOR_STATS
#ifdef LOOM_HAS_CUDA_ALLOCATOR_STATS
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <algorithm>
#include <cstdio>

namespace loom {

LOOM_INLINE void AcceleratorBase::start(TrainingArguments& args, Startup up, const ShardingFacts& sharding) {
  run_args_ = &args;
  world_ = up.world;
  device_ = up.device;
  state_.is_world_process_zero = world_.is_main();
  state_.is_local_process_zero = world_.is_local_main();
  sharding_ = sharding;
  saves_ = up.saves;
  // Before anything is written: a second run into the same folder stops here (one lock per
  // folder: each node's with save_on_each_node on storage that is not shared).
  if (saves_) output_lock_.emplace(args.output_dir);
  if (args.full_determinism) {
    enable_full_determinism(args.seed);
  } else {
    if (args.deterministic) enable_determinism();
    set_seed(args.seed);
  }
  // ddp_find_unused_parameters unset is off, not HF's rule (on unless gradient checkpointing):
  // its per-step all-reduce measured 0.7-4.6 % of a step on the CPU (docs/semantics.md).
  engine_ = dist::make_engine(sharding.name, std::move(up.comm),
                              {.bucket_cap_mb = static_cast<double>(args.ddp_bucket_cap_mb.value_or(25)),
                               .find_unused_parameters = args.ddp_find_unused_parameters.value_or(false),
                               .param_dtype = dist::sharding_dtype(args.sharding_param_dtype),
                               .reduce_dtype = dist::sharding_dtype(dist::reduce_dtype_name(args)),
                               .offload_param = args.offload_param,
                               .forward_prefetch = args.fsdp_forward_prefetch,
                               .backward_prefetch = static_cast<dist::BackwardPrefetch>(
                                   std::find(detail::kBackwardPrefetch.begin(), detail::kBackwardPrefetch.end(), args.fsdp_backward_prefetch) -
                                   detail::kBackwardPrefetch.begin()),
                               .wrap_classes = detail::wrap_classes_of(args),
                               .min_num_params = args.fsdp_min_num_params});
}

LOOM_INLINE void AcceleratorBase::prepare_module(torch::nn::Module& module) {
  check(module_ == nullptr, "prepare_model was called twice; an Accelerator prepares one model");
  module_ = &module;
  const auto& args = *run_args_;
  checkpointer_.emplace(args, world_, *engine_, module, saves_);
  if (args.model_name_or_path) checkpointer_->load_pretrained(*args.model_name_or_path);
  plan_memory(module);
  materialize_deferred(module);
  module.to(device_);
  // HF's gradient_checkpointing_enable: every unit / Checkpointed block recomputes in backward.
  if (args.gradient_checkpointing)
    check(dist::enable_gradient_checkpointing(module) > 0,
          "--gradient_checkpointing needs blocks wrapped in loom::FullShardUnit or loom::Checkpointed");
  engine_->setup(module);
  steps_.emplace(*engine_, device_, engine_->owns_grads(), run_args_->offload_optimizer);
  // DDP's broadcast_buffers (HF's ddp_broadcast_buffers, default on) for the policies that
  // keep a whole replica of the model on every rank.
  sync_buffers_ = sharding_.replicates_model && world_.size > 1 && args.ddp_broadcast_buffers.value_or(true) && !module.buffers().empty();
}

LOOM_INLINE void AcceleratorBase::materialize_deferred(torch::nn::Module& module) {
  if (!has_storage_less_parameters(module)) return;
  // Every rank draws the same values: rank 0's seed (a weight file is the same file everywhere).
  if (auto* values = dynamic_cast<DeferredValues*>(&module); values != nullptr && world_.size > 1 && engine_->comm() != nullptr) {
    auto seed = torch::full({1}, static_cast<int64_t>(values->init_seed()), torch::TensorOptions().dtype(torch::kLong).device(device_));
    engine_->comm()->broadcast({seed}, 0, "the initialization seed broadcast").wait();
    values->set_init_seed(static_cast<uint64_t>(seed.item<int64_t>()));
  }
  retarget_storage_less(module, device_);
  // FullShard's engine materializes only this rank's slice of each parameter (its set-up);
  // under the other policies every parameter is made whole here, on the device.
  if (!sharding_.shards_parameters) materialize(module);
}

LOOM_INLINE void AcceleratorBase::plan_memory(const torch::nn::Module& module) {
  const auto& args = *run_args_;
  auto in = memory_plan_inputs(module, args, sharding_, world_.size);
  in.activations = activation_bytes_;
  in.activation_note = activation_note_;
  memory_plan_ = make_memory_plan(in);
  if (world_.is_main()) log_message(LogLevel::info, "{}", format_memory_plan(*memory_plan_));
  if (args.skip_memory_check) return;
  // --max_memory: what each process may use, instead of the device's memory.
  const double capacity = args.max_memory ? static_cast<double>(detail::parse_byte_size(*args.max_memory, "--max_memory"))
                                          : device_memory_bytes(device_, world_.local_size);
  const auto refusal = memory_plan_refusal(*memory_plan_, capacity, device_.is_cpu());
  if (refusal) fail("{}", *refusal);
}

namespace detail {
// Every FusedGradients group of the model's modules in module order, a FullShard unit's block
// included (the wrapper registers the block's parameters, not the block).
inline std::vector<std::vector<torch::Tensor>> fused_gradient_groups(const torch::nn::Module& model) {
  std::vector<std::vector<torch::Tensor>> groups;
  for (const auto& m : model.modules(/*include_self=*/true)) {
    const auto* unit = dynamic_cast<const dist::FullShardUnitBase*>(m.get());
    for (auto& group : fused_gradients_of(unit != nullptr ? unit->block() : *m)) groups.push_back(std::move(group));
  }
  return groups;
}
}  // namespace detail

LOOM_INLINE void AcceleratorBase::prepare_optimizer(optim::Optimizer optimizer, schedule::LRSchedulerBase& scheduler) {
  check(module_ != nullptr, "prepare_optimizer needs the model first: call prepare_model");
  scheduler_ptr_ = &scheduler;
  more_.clear();  // a new first optimizer starts a new set
  held_.clear();
  all_bytes_ = {};
  steps_->reset(claim_parameters(std::move(optimizer), 0), scheduler, module_->parameters(),
                detail::fused_gradient_groups(*module_));
  loop_ = LoopState{};
  if (world_.size > 1) loop_.tr_loss.set_reducer([this](torch::Tensor& t) { engine_->all_reduce(t, "the loss all-reduce"); });
}

LOOM_INLINE std::size_t AcceleratorBase::add_optimizer_impl(optim::Optimizer optimizer,
                                                            schedule::LRSchedulerBase& scheduler,
                                                            std::function<double()> current_lr) {
  check(steps_ && steps_->has_optimizer(),
        "add_optimizer adds a further optimizer: call prepare_optimizer with the first one before");
  check(!scales_loss_,
        "add_optimizer: several optimizers cannot run under --fp16 (its one dynamic loss scale belongs to one "
        "optimizer's steps); use --bf16 or fp32");
  const std::size_t k = 1 + more_.size();
  auto steps = std::make_unique<OptimizerStep>(*engine_, device_, engine_->owns_grads(), run_args_->offload_optimizer);
  steps->reset(claim_parameters(std::move(optimizer), k), scheduler, module_->parameters(),
               detail::fused_gradient_groups(*module_));
  more_.push_back({std::move(steps), &scheduler, std::move(current_lr)});
  return k;
}

LOOM_INLINE optim::Optimizer AcceleratorBase::claim_parameters(optim::Optimizer optimizer, std::size_t k) {
  std::unordered_map<const c10::TensorImpl*, std::string> model_names;
  for (const auto& item : module_->named_parameters(true)) model_names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  bool renamed = false;
  std::vector<optim::ParamGroup> groups = optimizer.groups();
  for (auto& g : groups)
    for (std::size_t i = 0; i < g.params.size(); ++i) {
      const auto* impl = g.params[i].unsafeGetTensorImpl();
      const auto named = model_names.find(impl);
      const std::string name = named != model_names.end() ? named->second
                               : i < g.names.size()        ? g.names[i]
                                                           : std::string("(a tensor the model does not hold)");
      const auto [held, fresh] = held_.emplace(impl, k);
      check(fresh || held->second == k,
            "parameter {} is given to optimizer {}, but optimizer {} already holds it: each parameter belongs to one "
            "optimizer (build each over its own part of the model)", name, k, held->second);
      if (i < g.names.size() && g.names[i] != name && named != model_names.end()) {
        g.names[i] = name;
        renamed = true;
      }
    }
  // Named as in the model, so checkpoints key each state by the name the model saves (an
  // optimizer that has stepped already keeps its names with its state).
  if (!renamed || optimizer.wrapped() != nullptr || optimizer.steps() > 0) return optimizer;
  return optim::Optimizer(std::move(groups), optimizer.options());
}

LOOM_INLINE OptimizerStep& AcceleratorBase::steps_of(std::size_t k) {
  if (k == 0) {
    check(steps_.has_value(), "there is no optimizer yet: call prepare_model, then prepare_optimizer");
    return *steps_;
  }
  check(k <= more_.size(), "there is no optimizer {}: the Accelerator holds {} (prepare_optimizer's is 0, "
        "add_optimizer's 1, 2, ...)", k, num_optimizers());
  return *more_[k - 1].steps;
}

LOOM_INLINE std::vector<OptimizerStep*> AcceleratorBase::all_steps() {
  std::vector<OptimizerStep*> out{&*steps_};
  for (auto& m : more_) out.push_back(m.steps.get());
  return out;
}

LOOM_INLINE void AcceleratorBase::finish_optimizer(std::size_t k) {
  steps_of(k).finish();  // zeroes every gradient when the engine owns them
  if (more_.empty()) return;
  if (!engine_->owns_grads())
    for (std::size_t j = 0; j < num_optimizers(); ++j)
      if (j != k) steps_of(j).optimizer().zero_grad();
  if (all_bytes_.total() == 0 && std::all_of(more_.begin(), more_.end(), [](const auto& m) { return m.steps->state_bytes().total() > 0; }) &&
      steps_->state_bytes().total() > 0) {
    all_bytes_ = steps_->state_bytes();
    const double engine_host = engine_->state_bytes().host;  // --offload_param's shards: in each optimizer's figure
    for (const auto& m : more_) {
      all_bytes_.optimizer += m.steps->state_bytes().optimizer;
      all_bytes_.host += m.steps->state_bytes().host - engine_host;
    }
  }
}

LOOM_INLINE optim::Optimizer& AcceleratorBase::optimizer(std::size_t k) {
  check(steps_ && steps_->has_optimizer(), "there is no optimizer yet: it is created by train() (or prepare_optimizer)");
  return steps_of(k).optimizer();
}

LOOM_INLINE std::vector<std::optional<int64_t>> AcceleratorBase::eval_batches(int64_t num_batches) const {
  std::vector<std::optional<int64_t>> out;
  const int64_t rounds = (num_batches + world_.size - 1) / world_.size;
  for (int64_t k = 0; k < rounds; ++k) {
    const int64_t b = k * world_.size + world_.rank;
    out.push_back(b < num_batches ? std::optional<int64_t>(b) : std::nullopt);
  }
  return out;
}

LOOM_INLINE torch::Tensor AcceleratorBase::begin_accumulation(int64_t local_items, bool model_divides) {
  engine_->begin_group({local_items, run_args_->average_tokens_across_devices, model_divides}, device_);
  if (!model_divides) return {};
  if (const auto& global = engine_->global_items(); global.defined()) return global;
  return torch::full({}, static_cast<double>(local_items), torch::TensorOptions().device(device_).dtype(torch::kFloat));
}

LOOM_INLINE void AcceleratorBase::begin_micro_step(bool last) {
#if defined(LOOM_HAS_CUDA_ALLOCATOR_STATS)
  // HF's --torch_empty_cache_steps: the caching allocator's free blocks go back to the driver
  // before a micro-batch whose global step is a multiple of N (HF's training_step).
  if (const auto every = run_args_->torch_empty_cache_steps; every && device_.is_cuda() && state_.global_step % *every == 0)
    c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  engine_->begin_micro_step(last);
  if (sync_buffers_) dist::broadcast_buffers(*engine_->comm(), *module_);
}

LOOM_INLINE void AcceleratorBase::end_micro_step() { engine_->after_backward(); }

LOOM_INLINE torch::Tensor AcceleratorBase::reduce_sum(const torch::Tensor& t) {
  if (world_.size == 1) return t;
  torch::Tensor out = t.detach().clone();
  engine_->all_reduce(out, "reduce_sum");
  return out;
}

LOOM_INLINE torch::Tensor AcceleratorBase::gather_for_metrics(const torch::Tensor& t) {
  if (world_.size == 1) return t;
  const std::vector<int64_t> rows = t.defined() ? std::vector<int64_t>{t.dim() > 0 ? t.size(0) : 1}
                                                : std::vector<int64_t>{};
  torch::Tensor local = t.defined() && t.dim() == 0 ? t.reshape({1}) : t;
  return gather_in_batch_order(*engine_, world_, world_.size, local, rows, "gather_for_metrics");
}

LOOM_INLINE void AcceleratorBase::wait_for_everyone() {
  if (world_.size > 1) engine_->comm()->barrier("wait_for_everyone");
}

LOOM_INLINE std::vector<JsonPart> AcceleratorBase::checkpoint_parts() {
  check(scheduler_ptr_ != nullptr && steps_ && steps_->has_optimizer(),
        "a checkpoint needs the optimizer and its scheduler: call prepare_optimizer first");
  std::vector<JsonPart> parts{
      json_part(scheduler_file(0), *scheduler_ptr_), precision_part_,
      JsonPart{"loop_state.json",
               [this] {
                 auto j = loop_.state_dict(run_args_->logging_nan_inf_filter);
                 j["skipped_steps"] = steps_->skipped_steps();
                 // The batch layout, for the resume warning.
                 j["per_device_train_batch_size"] = run_args_->per_device_train_batch_size;
                 j["gradient_accumulation_steps"] = run_args_->gradient_accumulation_steps;
                 j["world_size"] = world_.size;
                 return j;
               },
               [this](const nlohmann::json& j) {
                 loop_.load_state_dict(j);
                 steps_->set_skipped_steps(json::Fields(j, "").integer("skipped_steps", 0));
                 resumed_loop_state_ = j;
               }}};
  for (std::size_t k = 1; k <= more_.size(); ++k) parts.push_back(json_part(scheduler_file(k), *more_[k - 1].scheduler));
  parts.insert(parts.end(), extra_parts_.begin(), extra_parts_.end());
  return parts;
}

LOOM_INLINE std::filesystem::path AcceleratorBase::save_state() {
  auto parts = checkpoint_parts();
  const auto optimizers = all_steps();
  for (auto* s : optimizers) s->settle_skip();
  checkpointer_->save(state_, optimizers, parts);
  return checkpoint::checkpoint_dir(run_args_->output_dir, state_.global_step);
}

LOOM_INLINE std::optional<std::filesystem::path> AcceleratorBase::resume_dir() {
  check(checkpointer_.has_value(), "resume_dir needs the model: call prepare_model first");
  return checkpointer_->resume_dir();
}

LOOM_INLINE std::optional<std::filesystem::path> AcceleratorBase::load_state() {
  auto dir = resume_dir();
  if (dir) load_state(*dir);
  return dir;
}

LOOM_INLINE void AcceleratorBase::load_state(const std::filesystem::path& dir) {
  auto parts = checkpoint_parts();
  checkpointer_->load(dir, state_, all_steps(), parts);
  const auto warning = resume_warning(resumed_loop_state_, *run_args_, world_.size, state_.global_step);
  if (!warning.empty() && should_log() && log_enabled(LogLevel::warning)) std::fprintf(stderr, "%s\n", warning.c_str());
}

LOOM_INLINE void AcceleratorBase::record_loss(torch::Tensor loss) {
  if (item_factor().defined()) loss = loss * item_factor();
  loop_.tr_loss.add(loss, state_.global_step - loop_.last_logged);
}

LOOM_INLINE AcceleratorBase::LoggedLoss AcceleratorBase::close_log_window(bool nan_inf_filter) {
  LoggedLoss out{loop_.tr_loss.total(nan_inf_filter), state_.global_step - loop_.last_logged};
  loop_.tr_loss.reset();
  loop_.total_loss += out.sum;
  loop_.last_logged = state_.global_step;
  return out;
}

}  // namespace loom
