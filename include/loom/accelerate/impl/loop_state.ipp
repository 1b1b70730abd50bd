#pragma once
#include <loom/accelerate/loop_state.hpp>

#include <loom/config/json.hpp>
#include <loom/core/error.hpp>
#include <loom/data/iterable.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

namespace loom {

LOOM_INLINE double LossWindow::total(bool nan_filter) const {
  // Summed in float32, one step after the other, as HF's tr_loss tensor is (bit for bit).
  auto tr = static_cast<float>(carry_);
  if (items_.empty()) return tr;
  std::vector<torch::Tensor> losses;
  losses.reserve(items_.size());
  for (const auto& [l, s] : items_) losses.push_back(l.reshape({}).to(torch::kFloat));
  auto stacked = torch::stack(losses);
  if (reduce_) reduce_(stacked);
  const auto host = stacked.cpu().contiguous();
  const float* v = host.data_ptr<float>();
  for (std::size_t i = 0; i < items_.size(); ++i)
    tr += (!nan_filter || std::isfinite(v[i])) ? v[i] : tr / static_cast<float>(1 + items_[i].second);
  return tr;
}

LOOM_INLINE nlohmann::json LoopState::state_dict(bool nan_filter) const {
  nlohmann::json j{{"tr_loss", tr_loss.total(nan_filter)},
                   {"total_loss", total_loss},
                   {"globalstep_last_logged", last_logged},
                   {"skipped_steps_logged", skipped_logged}};
  if (!train_stream.is_null()) j["train_stream"] = train_stream;
  return j;
}

LOOM_INLINE void LoopState::load_state_dict(const nlohmann::json& j) {
  const json::Fields f(j, "");
  // A nan/inf loss (logging_nan_inf_filter off) is written as null.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto loss = [&](const char* key) {
    if (!j.contains(key)) f.fail(key, "is missing");
    return j[key].is_null() ? nan : f.number(key);
  };
  tr_loss.reset(loss("tr_loss"));
  total_loss = loss("total_loss");
  last_logged = f.integer("globalstep_last_logged", 0);
  skipped_logged = f.optional_integer("skipped_steps_logged", 0).value_or(0);
  train_stream = j.contains("train_stream") ? j["train_stream"] : nlohmann::json();
}

LOOM_INLINE std::string resume_warning(const nlohmann::json& saved, const TrainingArguments& args, int world_size,
                                       int64_t global_step) {
  const json::Fields f(saved, "");
  const auto batch = f.optional_integer("per_device_train_batch_size", 1);
  const auto accumulation = f.optional_integer("gradient_accumulation_steps", 1);
  const auto world = f.optional_integer("world_size", 1);
  if (!batch || !accumulation || !world) return {};
  std::string changes;
  auto compare = [&](const char* name, int64_t was, int64_t now) {
    if (was != now) changes += (changes.empty() ? "" : ", ") + std::string(name) + " " + std::to_string(now) + " (was " +
                               std::to_string(was) + ")";
  };
  compare("per_device_train_batch_size", *batch, args.per_device_train_batch_size);
  compare("gradient_accumulation_steps", *accumulation, args.gradient_accumulation_steps);
  compare("world size", *world, world_size);
  if (changes.empty()) return {};
  const int64_t was = *batch * *accumulation * *world;
  const int64_t now = args.per_device_train_batch_size * args.gradient_accumulation_steps * world_size;
  return "loom: warning: resuming at step " + std::to_string(global_step) + " with " + changes + ": a step takes " +
         std::to_string(now) + " examples (was " + std::to_string(was) +
         "), the position in the data is recomputed in the new steps, so the examples after the resume are not "
         "those an uninterrupted run would read, and the learning-rate schedule follows this run's length";
}

namespace detail {
inline int64_t resolve_interval(double value, int64_t max_steps) {
  if (value > 0 && value < 1) return static_cast<int64_t>(std::ceil(value * static_cast<double>(max_steps)));
  return static_cast<int64_t>(value);
}
}  // namespace detail

LOOM_INLINE TrainingPlan TrainingPlan::make(const TrainingArguments& args, int64_t len, int64_t examples,
                                            int world_size) {
  check(len > 0, "the training set yields no batch ({} examples, per_device_train_batch_size {}{})", examples,
        args.per_device_train_batch_size, args.dataloader_drop_last ? ", dataloader_drop_last" : "");
  TrainingPlan p;
  const int64_t ga = args.gradient_accumulation_steps;
  p.batches_per_epoch = len;
  p.updates_per_epoch = std::max<int64_t>(len / ga + (len % ga > 0 ? 1 : 0), 1);
  const int64_t total_batch = args.per_device_train_batch_size * ga * world_size;
  if (args.max_steps > 0) {
    p.max_steps = args.max_steps;
    p.num_epochs = p.max_steps / p.updates_per_epoch + (p.max_steps % p.updates_per_epoch > 0 ? 1 : 0);
    p.num_train_samples = static_cast<double>(p.max_steps * total_batch);
  } else {
    p.max_steps = static_cast<int64_t>(std::ceil(args.num_train_epochs * static_cast<double>(p.updates_per_epoch)));
    p.num_epochs = static_cast<int64_t>(std::ceil(args.num_train_epochs));
    p.num_train_samples = static_cast<double>(examples) * args.num_train_epochs;
  }
  return p;
}

LOOM_INLINE TrainingPlan TrainingPlan::for_stream(const TrainingArguments& args, int world_size) {
  data::check_stream_max_steps(args.max_steps);
  TrainingPlan p;
  const int64_t ga = args.gradient_accumulation_steps;
  p.max_steps = args.max_steps;
  p.updates_per_epoch = args.max_steps;
  p.batches_per_epoch = args.max_steps * ga;
  p.num_epochs = std::numeric_limits<int64_t>::max();
  p.num_train_samples = static_cast<double>(args.max_steps * args.per_device_train_batch_size * ga * world_size);
  return p;
}

LOOM_INLINE TrainerState TrainingPlan::initial_state(const TrainingArguments& args, bool world_zero,
                                                     bool local_zero) const {
  TrainerState s;
  s.is_world_process_zero = world_zero;
  s.is_local_process_zero = local_zero;
  s.max_steps = max_steps;
  s.num_train_epochs = num_epochs;
  s.train_batch_size = args.per_device_train_batch_size;
  s.logging_steps = detail::resolve_interval(args.logging_steps, max_steps);
  // HF: eval_steps falls back to logging_steps only under eval_strategy steps (finalize()
  // sets it); otherwise trainer_state.json keeps TrainerState's default.
  if (args.eval_steps) s.eval_steps = detail::resolve_interval(*args.eval_steps, max_steps);
  s.save_steps = detail::resolve_interval(args.save_steps, max_steps);
  return s;
}

}  // namespace loom
