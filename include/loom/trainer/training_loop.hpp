#pragma once
// The Trainer's training loop (HF's _inner_training_loop), read top to bottom: the plan, the
// optimizer and scheduler, resuming, then per epoch and accumulation group the micro-steps
// (forward, backward, gradient exchange), the optimizer step and what follows it (logging,
// evaluation, saving, preemption), and the end of training. Every step goes through the
// Trainer's Accelerator's public API. Included by trainer.hpp.
//
// A training stream (a loader without a length, data/iterable.hpp) runs the same loop under
// TrainingPlan::for_stream: an epoch lasts until the stream ends (a short last accumulation
// group still steps), the next epoch starts it again, and the run stops at max_steps. The
// stream's position after each optimizer step goes into the checkpoint (loop_state.json's
// train_stream), and a resume seeks there instead of skipping batches.

#include <loom/trainer/trainer.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

namespace loom {

template <class Derived, class Model, class... Policies>
template <class Batch>
TrainOutput Trainer<Derived, Model, Policies...>::train_impl() {
  auto loader = call_hook<hook::get_train_dataloader>(self());
  const bool stream = !loader.has_length();
  const auto plan = stream ? TrainingPlan::for_stream(args_, acc_->world().size)
                           : TrainingPlan::make(args_, loader.size(), loader.num_examples(), acc_->world().size);
  const int64_t len = plan.batches_per_epoch, ga = args_.gradient_accumulation_steps;
  acc_->begin_run(plan.initial_state(args_, acc_->world().is_main(), acc_->world().is_local_main()));
  control_ = TrainerControl{};

  auto optimizer = call_hook<hook::create_optimizer>(self());
  scheduler_.emplace(call_hook<hook::create_scheduler>(self(), plan.max_steps));
  auto& module = detail::module_of(model_);
  acc_->prepare_optimizer(std::move(optimizer), *scheduler_);  // resets the loop's totals too
  module.train();
  kwargs_.optimizer = &acc_->optimizer();
  kwargs_.lr_scheduler = &*scheduler_;
  train_loader_info_ = stream ? LoaderInfo{0, 0, loader.batch_size()}
                              : LoaderInfo{loader.size(), loader.num_examples(), loader.batch_size()};
  kwargs_.train_dataloader = &train_loader_info_;

  last_saved_step_ = -1;
  int64_t epochs_trained = 0, batches_to_skip = 0;
  record_callback_states();  // HF's TrainerState(stateful_callbacks=...) at the start of training
  if (auto resume = acc_->resume_dir()) {
    acc_->load_state(*resume);
    if (args_.restore_callback_states_from_checkpoint) {
      callbacks_.load_states(acc_->state().stateful_callbacks);
      if (acc_->state().stateful_callbacks.contains("TrainerControl"))
        control_ = TrainerControl::from_state(nlohmann::json(acc_->state().stateful_callbacks["TrainerControl"]));
    }
    if (stream) {  // seek to where the stream stood (nothing is read again)
      const auto& position = acc_->loop().train_stream;
      check(!position.is_null(), "resuming training on a stream needs the stream's position, and {} has none (its "
            "loop_state.json has no train_stream: it was not saved by a run on a stream)", resume->string());
      epochs_trained = position.at("epoch").template get<int64_t>();
      batches_to_skip = args_.ignore_data_skip ? 0 : position.at("batches").template get<int64_t>();
      // --ignore_data_skip: the stream starts its epoch again
      loader.seek(args_.ignore_data_skip ? decltype(loader)::epoch_start(epochs_trained) : position);
    } else {
      epochs_trained = acc_->state().global_step / plan.updates_per_epoch;
      // --ignore_data_skip (HF's): the resumed epoch starts at its first batch
      batches_to_skip = args_.ignore_data_skip ? 0 : (acc_->state().global_step % plan.updates_per_epoch) * ga;
    }
  }

  const auto start = std::chrono::steady_clock::now();
  train_start_ = start;
  tokens_at_start_ = acc_->state().num_input_tokens_seen;
  tokens_pending_ = 0;
  const MemoryTracker memory("train", !args_.skip_memory_metrics, acc_->device());
  in_train_ = true;
  PreemptionWatch preemption(acc_->comm(), acc_->device());
  bool preempted = false;
  fire<event::on_train_begin>();
  if (args_.eval_on_start) (void)evaluate();  // HF: without stepping ReduceLROnPlateau

  torch::Tensor grad_norm;
  double last_lr = 0.0;
  const bool model_divides = model_divides_by_items();
  std::vector<Batch> group;
  std::vector<int64_t> items;
  data::BatchPrefetcher<Batch> batches(loader, prefetch_options());
  for (int64_t epoch = epochs_trained; epoch < plan.num_epochs; ++epoch) {
    // Resuming mid-epoch starts at the first batch not yet trained; nothing before it is read.
    const int64_t first_update = epoch == epochs_trained ? batches_to_skip / ga : 0;
    // A stream goes on after its last batch read (a group cut short by its end included).
    const int64_t first_batch = stream && epoch == epochs_trained ? batches_to_skip : first_update * ga;
    batches.start(epoch, first_batch, len);
    fire<event::on_epoch_begin>();
    int64_t step = first_batch - 1;
    for (int64_t update = first_update; update < plan.updates_per_epoch; ++update) {
      const int64_t first = update * ga;
      int64_t count = std::min(ga, len - first);
      // Gather the whole accumulation group first: the loss weights need its item count.
      group.clear();
      items.clear();
      int64_t group_items = 0;
      for (int64_t i = 0; i < count; ++i) {
        auto batch = batches.try_next();  // batch first + i
        if (!batch) {  // a stream's end: the epoch ends after this (shorter) group
          count = i;
          break;
        }
        group.push_back(std::move(*batch));
        // Counted on the host batch, so a token count never waits for the device.
        items.push_back(call_hook<hook::num_items>(self(), std::as_const(group.back())));
        if (args_.include_num_input_tokens_seen != "no") tokens_pending_ += input_tokens(group.back());
        acc_->count_batch(items.back(), call_hook<hook::floating_point_ops>(self(), std::as_const(group.back())));
        data::to_device(group.back(), acc_->device());
        group_items += items.back();
      }
      if (count == 0) {  // the stream has ended: a checkpoint from here on resumes in the next epoch
        acc_->set_stream_position(decltype(loader)::epoch_start(epoch + 1));
        break;
      }
      // Distributed: each rank's gradients are scaled by its share of the group's items. A
      // model that divides by the group's count gets it (HF's num_items_in_batch) instead.
      num_items_in_batch_ = acc_->begin_accumulation(group_items, model_divides);
      for (int64_t i = 0; i < count; ++i) {
        ++step;
        if (step % ga == 0) fire<event::on_step_begin>();
        const double divisor = model_divides ? 1.0
                               : group_items > 0 ? static_cast<double>(group_items) / static_cast<double>(items[i])
                                                 : static_cast<double>(count);
        acc_->begin_micro_step(i + 1 == count);
        const torch::Tensor loss_step = call_hook<hook::training_step>(self(), model_, group[i], divisor);
        if (i + 1 == count) num_items_in_batch_ = torch::Tensor();
        acc_->end_micro_step();
        acc_->record_loss(loss_step);
        if (i + 1 == count) {
          grad_norm = acc_->clip_grad_norm(args_.max_grad_norm);  // unscale, clip
          fire<event::on_pre_optimizer_step>();
          last_lr = acc_->optimizer_step();
          fire<event::on_optimizer_step>();
          acc_->finish_step();  // scaler update, scheduler, zero_grad
          acc_->end_step(static_cast<double>(epoch) + static_cast<double>(step + 1) / static_cast<double>(len));
          if (stream) acc_->set_stream_position(loader.position_after(step));
          fire<event::on_step_end>();
          maybe_log_save_evaluate<Batch>(grad_norm, last_lr);
          if (preemption.should_stop()) preempted = control_.should_training_stop = true;
        } else {
          fire<event::on_substep_end>();
        }
        if (control_.should_epoch_stop || control_.should_training_stop) break;
      }
      if (control_.should_epoch_stop || control_.should_training_stop) break;
    }
    if (stream && step < 0) {  // HF: an epoch without a single batch stops the run
      log_message(LogLevel::warning, "the training stream yields no batch in epoch {}: training stops at step {} of "
                  "--max_steps {}", epoch, acc_->state().global_step, plan.max_steps);
      control_.should_training_stop = true;
    }
    fire<event::on_epoch_end>();
    maybe_log_save_evaluate<Batch>(grad_norm, last_lr);
    if (control_.should_training_stop) break;
  }

  acc_->settle_skip();
  if (preempted || preemption.got_signal_at_end()) stop_for_preemption(preemption.stop_signal());
  in_train_ = false;
  if (args_.load_best_model_at_end && acc_->state().best_model_checkpoint) {
    log_message(LogLevel::info, "loading the best model from {} ({} = {})", *acc_->state().best_model_checkpoint,
                args_.metric_for_best_model.value_or("loss"), acc_->state().best_metric.value_or(0.0));
    acc_->load_model(*acc_->state().best_model_checkpoint);
  }
  const double total_loss = acc_->close_training_loss(args_.logging_nan_inf_filter);
  sync_tokens();
  TrainOutput out;
  out.global_step = acc_->state().global_step;
  out.training_loss = total_loss / static_cast<double>(std::max<int64_t>(acc_->state().global_step, 1));
  out.metrics = speed_metrics("train", start, plan.num_train_samples, static_cast<double>(plan.max_steps));
  if (args_.include_tokens_per_second)
    out.metrics.set("train_tokens_per_second", detail::round_to(static_cast<double>(acc_->loop().items_seen) /
                                                                    out.metrics.get("train_runtime").value(), 3));
  out.metrics.set("total_flos", acc_->state().total_flos);
  out.metrics.set("train_loss", out.training_loss);
  memory.stop(out.metrics);
  call_hook<hook::log>(self(), std::as_const(out.metrics));
  out.metrics.set("epoch", acc_->state().epoch);
  fire<event::on_train_end>();
  save_state();
  save_metrics("train", out.metrics);
  return out;
}

}  // namespace loom
