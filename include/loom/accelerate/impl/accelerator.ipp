#pragma once
#include <loom/config/json.hpp>
#include <loom/core/log.hpp>
#include <loom/distributed/checkpointed.hpp>
#include <loom/distributed/comm.hpp>
#include <loom/accelerate/accelerator.hpp>
#include <loom/accelerate/evaluation.hpp>

#include <cstdio>

namespace loom {

LOOM_INLINE void AcceleratorBase::start(TrainingArguments& args, Startup up, const ShardingFacts& sharding) {
  run_args_ = &args;
  world_ = up.world;
  device_ = up.device;
  state_.is_world_process_zero = world_.is_main();
  state_.is_local_process_zero = world_.is_local_main();
  sharding_ = sharding;
  // Before anything is written: a second run into the same folder stops here.
  if (world_.is_main()) output_lock_.emplace(args.output_dir);
  if (args.full_determinism) enable_full_determinism(args.seed);
  else set_seed(args.seed);
  // ddp_find_unused_parameters unset is off, not HF's rule (on unless gradient checkpointing):
  // its per-step all-reduce measured 0.7-4.6 % of a step on the CPU (docs/semantics.md).
  engine_ = dist::make_engine(sharding.name, std::move(up.comm),
                              {.bucket_cap_mb = static_cast<double>(args.ddp_bucket_cap_mb.value_or(25)),
                               .find_unused_parameters = args.ddp_find_unused_parameters.value_or(false)});
}

LOOM_INLINE void AcceleratorBase::prepare_module(torch::nn::Module& module) {
  check(module_ == nullptr, "prepare_model was called twice; an Accelerator prepares one model");
  module_ = &module;
  const auto& args = *run_args_;
  checkpointer_.emplace(args, world_, *engine_, module);
  if (args.model_name_or_path) checkpointer_->load_pretrained(*args.model_name_or_path);
  module.to(device_);
  // HF's gradient_checkpointing_enable: every unit / Checkpointed block recomputes in backward.
  if (args.gradient_checkpointing)
    check(dist::enable_gradient_checkpointing(module) > 0,
          "--gradient_checkpointing needs blocks wrapped in loom::FullShardUnit or loom::Checkpointed");
  engine_->setup(module);
  steps_.emplace(*engine_, device_, engine_->owns_grads());
  // DDP's broadcast_buffers (HF's ddp_broadcast_buffers, default on) for the policies that
  // keep a whole replica of the model on every rank.
  sync_buffers_ = sharding_.replicates_model && world_.size > 1 && args.ddp_broadcast_buffers.value_or(true) && !module.buffers().empty();
}

LOOM_INLINE void AcceleratorBase::prepare_optimizer(optim::Optimizer optimizer, schedule::LRSchedulerBase& scheduler) {
  check(module_ != nullptr, "prepare_optimizer needs the model first: call prepare_model");
  scheduler_ptr_ = &scheduler;
  steps_->reset(std::move(optimizer), scheduler, module_->parameters());
  loop_ = LoopState{};
  if (world_.size > 1) loop_.tr_loss.set_reducer([this](torch::Tensor& t) { engine_->all_reduce(t, "the loss all-reduce"); });
}

LOOM_INLINE optim::Optimizer& AcceleratorBase::optimizer() {
  check(steps_ && steps_->has_optimizer(), "there is no optimizer yet: it is created by train() (or prepare_optimizer)");
  return steps_->optimizer();
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

LOOM_INLINE void AcceleratorBase::begin_accumulation(int64_t local_items) { engine_->begin_group(local_items, device_); }

LOOM_INLINE void AcceleratorBase::begin_micro_step(bool last) {
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
      json_part("scheduler.json", *scheduler_ptr_), precision_part_,
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
  parts.insert(parts.end(), extra_parts_.begin(), extra_parts_.end());
  return parts;
}

LOOM_INLINE std::filesystem::path AcceleratorBase::save_state() {
  auto parts = checkpoint_parts();
  steps_->settle_skip();
  checkpointer_->save(state_, *steps_, parts);
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
  checkpointer_->load(dir, state_, *steps_, parts);
  const auto warning = resume_warning(resumed_loop_state_, *run_args_, world_.size, state_.global_step);
  if (!warning.empty() && world_.is_main() && log_enabled(LogLevel::warning)) std::fprintf(stderr, "%s\n", warning.c_str());
}

}  // namespace loom
