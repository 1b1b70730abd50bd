#pragma once
// A training loop written by hand on loom::Accelerator, doing what Trainer::train does for a
// model whose loss is `loss_fn(model, batch)`: the same data order, accumulation weighting,
// clipping, optimizer and schedule, logged losses, checkpoints and evaluation. The tests
// compare it with the Trainer (tests/trainer/test_accelerator.cpp, one process; the dist
// worker's --loop accelerator, 2 ranks), and resume each from the other's checkpoints.

#include <loom/loom.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

namespace loom_test {

/// An evaluation on `eval` with HF's argmax accuracy and a position-weighted accuracy (which
/// changes if the gather puts the batches out of order), as tests/dist's compute_metrics.
template <class Acc, class Model, class Batch>
loom::Metrics plain_evaluate(Acc& acc, Model& model, const loom::data::AnyDataset<Batch>& eval) {
  auto loader = acc.prepare_eval_loader(eval);
  loader.set_epoch(0);
  const bool was_training = model->is_training();
  model->eval();
  torch::NoGradGuard no_grad;
  acc.begin_evaluation();
  std::vector<torch::Tensor> preds, labels;
  for (const auto b : acc.eval_batches(loader.size())) {
    torch::Tensor p, l;
    if (b || acc.forward_is_collective()) {
      auto batch = loader.batch(b.value_or(0));
      loom::data::to_device(batch, acc.device());
      auto autocast = acc.autocast();
      if (b) {
        p = model->forward(batch.x);
        l = batch.labels;
      } else {
        (void)model->forward(batch.x);  // FullShard: every rank joins every forward
      }
    }
    preds.push_back(acc.gather_for_metrics(p).cpu());
    labels.push_back(acc.gather_for_metrics(l).cpu());
  }
  acc.end_evaluation();
  if (was_training) model->train();
  const auto correct = torch::cat(preds).argmax(1).eq(torch::cat(labels)).to(torch::kDouble);
  const auto weights = torch::arange(1, correct.size(0) + 1, torch::kDouble);
  return {{"eval_accuracy", correct.mean().template item<double>()},
          {"eval_ordered_accuracy", (correct * weights).sum().template item<double>() / weights.sum().template item<double>()},
          {"eval_rows", static_cast<double>(correct.size(0))}};
}

/// Trains `model` on `train` as Trainer::train would with the same arguments (resuming from
/// --resume_from_checkpoint when given; saving every --save_steps under --save_strategy steps;
/// evaluating on `eval` every --eval_steps under --eval_strategy steps), logging into
/// acc.state().log_history. `loss_fn(model, batch)` returns the batch's scalar loss.
template <class Acc, class Model, class Batch, class LossFn>
void plain_train(Acc& acc, Model& model, loom::data::AnyDataset<Batch> train, LossFn loss_fn,
                 const std::optional<loom::data::AnyDataset<Batch>>& eval = std::nullopt) {
  const auto& args = acc.args();
  acc.prepare_model(model);
  auto loader = acc.prepare_train_loader(std::move(train));
  const auto plan = loom::TrainingPlan::make(args, loader.size(), loader.num_examples(), acc.num_processes());
  loom::schedule::LRScheduler<loom::schedule::FromArgs> scheduler(
      loom::schedule::make_schedule_params(args, plan.max_steps), args.lr_scheduler_type);
  acc.prepare_optimizer(loom::optim::make_optimizer(args, *model), scheduler);
  auto& state = acc.state();
  state = plan.initial_state(args, acc.is_main_process(), acc.is_local_main_process());

  const int64_t ga = args.gradient_accumulation_steps, len = plan.batches_per_epoch;
  int64_t first_epoch = 0, first_update = 0;
  if (acc.load_state()) {  // --resume_from_checkpoint: a Trainer's checkpoint or one of ours
    first_epoch = state.global_step / plan.updates_per_epoch;
    first_update = state.global_step % plan.updates_per_epoch;
  }
  model->train();
  // The losses since the last log and the run's totals: the Trainer's LoopState, which the
  // checkpoint keeps (loop_state.json), so a Trainer resuming our checkpoint logs as we would.
  auto& loop = acc.loop();
  for (int64_t epoch = first_epoch; epoch < plan.num_epochs && state.global_step < plan.max_steps; ++epoch) {
    loader.set_epoch(epoch);
    for (int64_t update = epoch == first_epoch ? first_update : 0;
         update < plan.updates_per_epoch && state.global_step < plan.max_steps; ++update) {
      const int64_t first = update * ga, count = std::min(ga, len - first);
      std::vector<Batch> group;
      std::vector<int64_t> rows;
      int64_t items = 0;
      for (int64_t i = 0; i < count; ++i) {
        group.push_back(loader.batch(first + i));
        rows.push_back(loom::data::batch_rows(group.back()));
        items += rows.back();
        loom::data::to_device(group.back(), acc.device());
      }
      acc.begin_accumulation(items);
      for (int64_t i = 0; i < count; ++i) {
        acc.begin_micro_step(i + 1 == count);
        torch::Tensor loss;
        {
          auto autocast = acc.autocast();
          loss = loss_fn(model, group[static_cast<std::size_t>(i)]);
        }
        // Each micro-batch weighted by its share of the group's items, as the Trainer does.
        loss = loss.to(torch::kFloat) / (static_cast<double>(items) / static_cast<double>(rows[static_cast<std::size_t>(i)]));
        acc.backward(loss);
        acc.end_micro_step();
        auto logged = loss.detach();
        if (acc.item_factor().defined()) logged = logged * acc.item_factor();
        loop.tr_loss.add(logged, state.global_step - loop.last_logged);
      }
      const auto grad_norm = acc.clip_grad_norm(args.max_grad_norm);
      const double lr = acc.step();
      state.global_step += 1;
      state.epoch = static_cast<double>(epoch) + static_cast<double>(first + count) / static_cast<double>(len);
      if (state.global_step % state.logging_steps == 0) {
        const double total = loop.tr_loss.total(args.logging_nan_inf_filter);  // summed over ranks
        loop.tr_loss.reset();
        state.append_log({{"loss", total / static_cast<double>(state.global_step - loop.last_logged)},
                          {"grad_norm", grad_norm.template item<double>()},
                          {"learning_rate", lr}});
        loop.total_loss += total;
        loop.last_logged = state.global_step;
      }
      if (eval && args.eval_strategy == "steps" && state.global_step % state.eval_steps == 0) {
        auto metrics = plain_evaluate(acc, model, *eval);
        metrics.set("epoch", state.epoch);
        state.append_log(metrics);
      }
      if (args.save_strategy == "steps" && state.global_step % state.save_steps == 0) (void)acc.save_state();
    }
  }
}

}  // namespace loom_test
