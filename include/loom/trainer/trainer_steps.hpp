#pragma once
// The Trainer's member functions defined out of the class, so that trainer.hpp reads as its
// interface and its training loop: the defaults of the hooks that have a body of their own
// (compute_loss, training_step, prediction_step, log), predict and save_model, start-up
// (init), what happens between optimizer steps (logging, evaluating, saving, ReduceLROnPlateau,
// the token count, preemption) and the evaluation loop. Included by trainer.hpp.

#include <loom/core/forward_request.hpp>
#include <loom/trainer/trainer.hpp>

#include <boost/pfr.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom {

// ---- default hooks and helpers defined out of the class ---------------------------------

template <class Derived, class Model, class... Policies>
template <detail::TrainSource Train, data::Dataset Eval>
Trainer<Derived, Model, Policies...>::Trainer(TrainingArguments args, Model model, Train train_dataset,
                                              EvalDatasets<Eval> eval_datasets)
    : args_(std::move(args)), model_(std::move(model)) {
  for (auto& [name, dataset] : eval_datasets) {
    check(!name.empty(), "the names of the evaluation datasets must not be empty");
    add_eval_dataset(std::move(name), std::move(dataset));
  }
  init(std::move(train_dataset));
}

template <class Derived, class Model, class... Policies>
template <class Batch>
double Trainer<Derived, Model, Policies...>::floating_point_ops(const Batch& batch) {
  if constexpr (requires { model_->floating_point_ops(batch); })
    return static_cast<double>(model_->floating_point_ops(batch));
  else
    return 0.0;
}

template <class Derived, class Model, class... Policies>
auto Trainer<Derived, Model, Policies...>::create_scheduler(int64_t num_training_steps) -> scheduler_type {
  auto p = schedule::make_schedule_params(args_, num_training_steps);
  if constexpr (schedule::NamedAtRunTime<scheduler_type>)
    return scheduler_type(std::move(p), args_.lr_scheduler_type);
  else
    return scheduler_type(std::move(p));
}

template <class Derived, class Model, class... Policies>
template <class Batch>
auto Trainer<Derived, Model, Policies...>::get_train_dataloader() {
  using B = batch_type<Batch>;
  if (data_->train_stream)
    return data::DataLoader<B>(*data_->train_stream, args_.per_device_train_batch_size, args_.dataloader_drop_last,
                               data::Shard{acc_->world().rank, acc_->world().size});
  check(data_->train.has_value(),
        "training needs a training dataset; this Trainer was built without one (loom::no_train_dataset)");
  return data::DataLoader<B>(*data_->train, args_.per_device_train_batch_size, args_.dataloader_drop_last,
                             acc_->train_sampler(train_lengths_), data::Shard{acc_->world().rank, acc_->world().size});
}

// HF's rule for who normalizes a training loss: a model that takes num_items_in_batch
// (accepts_num_items_in_batch) under the default compute_loss, without label smoothing,
// divides its summed loss by the group's count itself, and the Trainer divides by nothing
// more; otherwise the Trainer divides the batch's mean by (group items / batch items).
template <class Derived, class Model, class... Policies>
bool Trainer<Derived, Model, Policies...>::model_divides_by_items() const {
  if constexpr (requires { &Self::compute_loss; } || !detail::accepts_num_items_in_batch<Model>()) return false;
  else return args_.label_smoothing_factor == 0;
}

template <class Derived, class Model, class... Policies>
template <class Event, class... X>
void Trainer<Derived, Model, Policies...>::fire(const X&... x) {
  callbacks_.template fire<Event>(args_, acc_->state(), control_, kwargs_, x...);
}

template <class Derived, class Model, class... Policies>
void Trainer<Derived, Model, Policies...>::record_callback_states() {
  callbacks_.save_states(acc_->state().stateful_callbacks);
  acc_->state().stateful_callbacks["TrainerControl"] = control_.state();
}

template <class Derived, class Model, class... Policies>
data::PrefetchOptions Trainer<Derived, Model, Policies...>::prefetch_options() const {
  return {args_.dataloader_num_workers, args_.dataloader_prefetch_factor.value_or(2),
          args_.dataloader_pin_memory && acc_->device().is_cuda(), acc_->device()};
}

template <class Derived, class Model, class... Policies>
template <class Batch>
auto Trainer<Derived, Model, Policies...>::compute_loss(Model& model, Batch& batch) {
  if constexpr (std::is_same_v<Batch, detail::UnknownBatch> || requires { &Self::compute_loss; }) {
    return torch::Tensor{};  // reached only after a loom: error about the batch type or the override
  } else if constexpr (requires { model->forward(batch); }) {
    using R = decltype(model->forward(batch));
    static_assert(LossResult<R>, "loom: the default compute_loss needs model->forward(batch) to return "
                                 "a loss tensor or an aggregate with a `loss` member; override compute_loss");
    const torch::Tensor* labels = data::field_named(batch, "labels");
    if (args_.label_smoothing_factor == 0 || labels == nullptr || !labels->defined()) {
      // A training forward (grad mode on) and a --prediction_loss_only evaluation read only the
      // loss: a causal LM then runs its head only where a label is (core/forward_request.hpp).
      // A training forward also gets the group's count when the model divides by it (HF's
      // num_items_in_batch; model_divides_by_items).
      const bool training = torch::GradMode::is_enabled();
      ForwardRequestScope request({.logits = !(training || args_.prediction_loss_only),
                                   .chunked_lm_loss = args_.chunked_lm_loss,
                                   .num_items_in_batch = training ? num_items_in_batch_ : torch::Tensor()});
      return model->forward(batch);
    }
    if constexpr (requires(R r) { { r.logits } -> std::convertible_to<torch::Tensor>; r.loss = torch::Tensor{}; }) {
      using Impl = std::decay_t<decltype(*model)>;
      constexpr bool causal = [] {
        if constexpr (requires { bool(Impl::is_causal_lm); }) return bool(Impl::is_causal_lm);
        else return false;
      }();
      const torch::Tensor target = *labels;
      Batch unlabeled = batch;  // HF pops the labels: the model returns its logits, no loss of its own
      constexpr auto names = boost::pfr::names_as_array<Batch>();
      boost::pfr::for_each_field(unlabeled, [&](torch::Tensor& t, std::size_t i) {
        if (names[i] == "labels") t = torch::Tensor();
      });
      R out = model->forward(unlabeled);
      out.loss = label_smoothed_loss(out.logits, target, args_.label_smoothing_factor, causal);
      return out;
    } else {
      fail("--label_smoothing_factor needs the model's forward to return its logits (an aggregate with `loss` "
           "and `logits`, such as loom::ModelOutput), or a compute_loss override that applies it");
      return model->forward(batch);
    }
  } else {
    static_assert(dependent_false_v<Batch>, "loom: the default compute_loss calls model->forward(batch), "
                                            "which does not exist; override compute_loss(Model&, Batch&)");
  }
}

template <class Derived, class Model, class... Policies>
template <class Batch>
torch::Tensor Trainer<Derived, Model, Policies...>::training_step(Model& model, Batch& batch, double loss_divisor) {
  torch::Tensor loss;
  {
    auto autocast = acc_->autocast();
    loss = loss_of(call_hook<hook::compute_loss>(self(), model, batch));
  }
  check(loss.defined() && loss.numel() == 1, "compute_loss must return a scalar loss, got shape {}",
        loss.defined() ? c10::str(loss.sizes()) : std::string("undefined"));
  if (loss.scalar_type() != torch::kFloat) loss = loss.to(torch::kFloat);
  if (loss_divisor != 1.0) loss = loss / loss_divisor;
  acc_->backward(loss);
  return loss.detach();
}

template <class Derived, class Model, class... Policies>
template <class Batch>
PredictionOutput Trainer<Derived, Model, Policies...>::prediction_step(Model& model, Batch& batch) {
  torch::NoGradGuard no_grad;
  auto autocast = acc_->autocast();
  auto out = call_hook<hook::compute_loss>(self(), model, batch);
  PredictionOutput p;
  if (torch::Tensor loss = loss_of(out); loss.defined()) p.loss = loss.detach();
  p.logits = logits_of(out);
  std::vector<torch::Tensor> labels;
  for (const auto& name : label_names_) {
    const torch::Tensor* t = data::field_named(batch, name);
    if (t == nullptr || !t->defined()) return p;
    labels.push_back(*t);
  }
  if (labels.empty()) return p;
  p.labels = labels.front();
  if (labels.size() > 1) p.all_labels = std::move(labels);
  // Seq2SeqTrainer's predict_with_generate: the generated tokens (a causal LM: each row's
  // completion from its prompt) and their references replace the logits and labels.
  if constexpr (detail::can_generate<Model, Batch>) {
    if (args_.predict_with_generate && !args_.prediction_loss_only) {
      auto generated = evaluation_generate(model, std::as_const(batch), std::as_const(args_));
      p.logits = std::move(generated.predictions);
      p.labels = std::move(generated.references);
      p.all_labels.clear();
    }
  }
  return p;
}

template <class Derived, class Model, class... Policies>
void Trainer<Derived, Model, Policies...>::log(const Metrics& logs) {
  Metrics entry = logs;
  entry.set("epoch", acc_->state().epoch);
  if (args_.include_num_input_tokens_seen != "no")
    entry.set("num_input_tokens_seen", static_cast<double>(acc_->state().num_input_tokens_seen));
  acc_->state().append_log(entry);
  fire<event::on_log>(entry);
}

template <class Derived, class Model, class... Policies>
template <data::Dataset D>
PredictResult Trainer<Derived, Model, Policies...>::predict(D test_dataset, const std::string& metric_key_prefix) {
  using Batch = batch_type<D>;
  static_assert(std::is_same_v<data::batch_t<D>, Batch>,
                "loom: the test dataset yields another batch type than compute_loss takes");
  const data::AnyDataset<Batch> dataset(std::move(test_dataset));
  auto loader = call_hook<hook::get_test_dataloader>(self(), dataset);
  const MemoryTracker memory(metric_key_prefix, !args_.skip_memory_metrics && !in_train_, acc_->device());
  acc_->begin_evaluation();
  auto result = evaluation_loop<Batch>(loader, metric_key_prefix, /*predicting=*/true);
  acc_->end_evaluation();
  memory.stop(result.metrics);
  fire<event::on_predict>(result.metrics);
  return result;
}

template <class Derived, class Model, class... Policies>
nlohmann::json Trainer<Derived, Model, Policies...>::model_config_json() const {
  // A loom model's config.json as HF writes it; else a reflectable `config` member, as is.
  if constexpr (requires { model_->hf_config(); }) {
    auto config = model_->hf_config();
    // HF's Trainer sets model.config.use_cache = args.use_cache, so its folders say so.
    if (config.is_object() && config.contains("use_cache")) config["use_cache"] = args_.use_cache;
    return config;
  } else if constexpr (requires { model_->config; }) {
    using Config = std::decay_t<decltype(model_->config)>;
    if constexpr (std::is_aggregate_v<Config>) return loom::to_json(model_->config);
  }
  return nullptr;
}

template <class Derived, class Model, class... Policies>
void Trainer<Derived, Model, Policies...>::save_model(std::optional<std::string> output_dir) {
  acc_->save_model(std::filesystem::path(output_dir.value_or(args_.output_dir)));
}

template <class Derived, class Model, class... Policies>
void Trainer<Derived, Model, Policies...>::save_merged_model(std::optional<std::string> output_dir) {
  acc_->save_merged_model(std::filesystem::path(output_dir.value_or(args_.output_dir + "/merged")));
}

template <class Derived, class Model, class... Policies>
template <class Eval>
void Trainer<Derived, Model, Policies...>::add_eval_dataset(std::string name, Eval dataset) {
  using Batch = batch_type<Eval>;
  static_assert(std::is_same_v<data::batch_t<Eval>, Batch> || std::is_same_v<Batch, detail::UnknownBatch>,
                "loom: the evaluation dataset yields another batch type than compute_loss takes");
  if (!data_) data_ = std::make_unique<datasets_type>();
  for (const auto& [known, unused] : data_->eval)
    check(known != name, "two evaluation datasets are named \"{}\"", name);
  if constexpr (std::is_same_v<data::batch_t<Eval>, Batch>)
    data_->eval.emplace_back(std::move(name), data::AnyDataset<Batch>(std::move(dataset)));
}

template <class Derived, class Model, class... Policies>
template <class Train>
void Trainer<Derived, Model, Policies...>::init(Train train_dataset) {
  using Batch = batch_type<Train>;
  constexpr bool known = !std::is_same_v<Batch, detail::UnknownBatch>;  // else already an error
  if constexpr (!std::is_same_v<Train, NoTrainDataset>)
    static_assert(std::is_same_v<data::train_batch_t<Train>, Batch> || !known,
                  "loom: the training dataset yields another batch type than compute_loss takes");
  static_assert(schedule::Schedule<scheduler_type>,
                "loom: the scheduler does not provide the Schedule interface (schedule/schedule_decl.hpp)");
  if (!data_) data_ = std::make_unique<datasets_type>();
  // Start-up: the arguments checked against the policies, the world, device, precision, seed
  // and engine.
  acc_.emplace(args_, schedule_policy::name, !data_->eval.empty());
  std::optional<detail::TrainSequenceLength> sequence_length;  // for the memory plan's activation estimate
  if constexpr (!std::is_same_v<Train, NoTrainDataset>) sequence_length = detail::train_sequence_length(train_dataset);
  if constexpr (!data::Dataset<Train> && data::IterableDataset<Train> && known) {
    // HF's rule, at start-up: a dataset without a length trains for --max_steps.
    data::check_stream_max_steps(args_.max_steps);
    check(args_.train_sampling_strategy != "group_by_length",
          "--train_sampling_strategy group_by_length needs every example's length, and the training dataset is a "
          "stream (an iterable dataset)");
    data_->train_stream.emplace(std::move(train_dataset));
  } else if constexpr (!std::is_same_v<Train, NoTrainDataset> && known) {
    if (args_.train_sampling_strategy == "group_by_length")
      train_lengths_ = std::make_shared<const std::vector<int64_t>>(
          data::example_lengths(train_dataset, args_.length_column_name));
    data_->train.emplace(std::move(train_dataset));
  }
  label_names_ = detail::label_names_of(args_);
  check(ExposesNEFTune<Model> || !args_.neftune_noise_alpha,
        "--neftune_noise_alpha needs a model that exposes its input embeddings' noise: `loom::NEFTune& neftune()` "
        "on the module, applied to the token embeddings in forward (core/neftune.hpp; loom's GPT-2 and BERT "
        "have it)");
  if constexpr (known) check_label_names<Batch>();
  if constexpr (known)
    check(!args_.predict_with_generate || detail::can_generate<Model, Batch>,
          "--predict_with_generate needs a model that generates from this batch type: loom::models' causal LMs "
          "(GPT-2, the Llama family) on CausalLMBatch, with <loom/models/generation.hpp> included");
  check(!args_.predict_with_generate || !acc_->forward_is_collective(),
        "--predict_with_generate is not supported under --sharding {}: its ranks would generate different numbers "
        "of tokens through a collective forward", args_.sharding);
  check(!(args_.bf16_full_eval || args_.fp16_full_eval) || !acc_->forward_is_collective(),
        "--{} casts the whole model for evaluations outside training, and under --sharding {} each rank holds only "
        "its shards of the parameters (gathered per unit in each forward); evaluate under --bf16 / --fp16 autocast, "
        "or gather in bfloat16 with --sharding_param_dtype bf16", args_.bf16_full_eval ? "bf16_full_eval" : "fp16_full_eval",
        args_.sharding);
  check(!args_.batch_eval_metrics || hook::compute_metrics::batched<Self>,
        "--batch_eval_metrics calls compute_metrics(const loom::EvalPrediction&, bool compute_result) once per "
        "batch, and this Trainer's compute_metrics has no compute_result parameter; declare that form (HF's "
        "compute_metrics(eval_pred, compute_result)) or drop the flag");
  // Only the default compute_loss applies --label_smoothing_factor (HF's rule too); an
  // override that does not would silently train without it.
  if constexpr (requires { &Self::compute_loss; }) {
    static bool warned = false;  // once per Trainer type in a process (a search builds many)
    if (args_.label_smoothing_factor != 0 && !std::exchange(warned, true))
      log_message(LogLevel::warning,
                  "--label_smoothing_factor {} is applied by the default compute_loss only, and this Trainer "
                  "overrides compute_loss: apply it there (loom::label_smoothed_loss), or drop the flag",
                  args_.label_smoothing_factor);
  }
  // checkpointer, --model_name_or_path, device, --gradient_checkpointing, engine set-up
  if constexpr (detail::EstimatesActivations<Model>) {
    if (sequence_length) {
      const int64_t element = args_.bf16 || args_.fp16 ? 2 : 4;
      const int64_t tokens = sequence_length->tokens;
      // The estimate of the forward the default compute_loss runs (a causal LM's head at the
      // scored positions only); an override reads whatever it reads.
      ForwardRequestScope request({.logits = requires { &Self::compute_loss; } || args_.label_smoothing_factor != 0,
                                   .chunked_lm_loss = args_.chunked_lm_loss});
      acc_->set_activation_estimate(
          model_->activation_bytes(args_.per_device_train_batch_size, tokens, element, args_.gradient_checkpointing),
          fmt::format("batch {} x sequence {}{}, {}-byte activations{}", args_.per_device_train_batch_size, tokens,
                      sequence_length->longest ? " (the longest a batch can have)" : "", element,
                      args_.gradient_checkpointing ? ", recomputed" : ""));
    } else {
      acc_->set_activation_estimate(std::nullopt, "the training dataset states no sequence length (block_size() or "
                                                  "max_sequence_length())");
    }
  }
  acc_->prepare_module(detail::module_of(model_));
  acc_->set_model_files(model_config_json(), tokenizer_files_);
  kwargs_.model = &detail::module_of(model_);
  add_reporters();
  fire<event::on_init_end>();
}

template <class Derived, class Model, class... Policies>
void Trainer<Derived, Model, Policies...>::add_reporters() {
  const bool all = detail::list_has(args_.report_to, "all");
  if ((all || detail::list_has(args_.report_to, "jsonl")) && !callbacks_type::template compiled<JsonlLogger>)
    callbacks_.add(std::make_shared<detail::ReportTo<JsonlLogger>>());
  if ((all || detail::list_has(args_.report_to, "tensorboard")) && !callbacks_type::template compiled<TensorBoardLogger>)
    callbacks_.add(std::make_shared<detail::ReportTo<TensorBoardLogger>>());
}

template <class Derived, class Model, class... Policies>
template <class Batch>
void Trainer<Derived, Model, Policies...>::check_label_names() const {
  constexpr auto names = boost::pfr::names_as_array<Batch>();
  for (const auto& name : label_names_) {
    if (std::ranges::find(names, std::string_view(name)) != names.end()) continue;
    std::string fields;
    for (std::string_view f : names) fields += (fields.empty() ? "" : ", ") + std::string(f);
    if (args_.label_names)
      fail("--label_names names '{}', which is no field of the batch (its fields: {})", name, fields);
  }
}

template <class Derived, class Model, class... Policies>
void Trainer<Derived, Model, Policies...>::sync_tokens() {
  if (args_.include_num_input_tokens_seen == "no") return;
  int64_t delta = tokens_pending_;
  tokens_pending_ = 0;
  if (acc_->world().size > 1) {
    auto t = torch::full({1}, delta, torch::TensorOptions().dtype(torch::kLong).device(acc_->device()));
    t = acc_->reduce_sum(t);
    delta = t.cpu().template item<int64_t>();
  }
  acc_->add_input_tokens(delta);
}

template <class Derived, class Model, class... Policies>
template <class Batch>
void Trainer<Derived, Model, Policies...>::maybe_log_save_evaluate(const torch::Tensor& grad_norm, double lr) {
  if (control_.should_log || control_.should_evaluate || control_.should_save) sync_tokens();
  if (control_.should_log && acc_->state().global_step > acc_->loop().last_logged) {
    const auto window = acc_->close_log_window(args_.logging_nan_inf_filter);
    Metrics logs;
    logs.set("loss", window.sum / static_cast<double>(window.steps));
    if constexpr (precision::ScalesLoss<precision_type>) if (acc_->scales_loss()) {
      // fp16: how many of the window's steps the scaler skipped (their loss still counts).
      acc_->settle_skip();
      logs.set("skipped_steps", static_cast<double>(acc_->take_skipped_since_log()));
    }
    if (grad_norm.defined()) logs.set("grad_norm", grad_norm.item<double>());
    logs.set("learning_rate", lr);
    if (args_.include_num_input_tokens_seen != "no") {
      // HF's log(logs, start_time): this session's tokens per second so far.
      logs.merge(speed_metrics("train", train_start_));
      logs.set("train_tokens_per_second",
               detail::round_to(static_cast<double>(acc_->state().num_input_tokens_seen - tokens_at_start_) /
                                    logs.get("train_runtime").value(), 3));
    }
    call_hook<hook::log>(self(), std::as_const(logs));
  }
  if (control_.should_evaluate) {
    const Metrics metrics = evaluate();
    step_plateau(metrics);
    const bool new_best = best_.update(metrics, acc_->state());
    if (args_.save_strategy == "best") control_.should_save = new_best;
  }
  if (control_.should_save) save_checkpoint();
}

template <class Derived, class Model, class... Policies>
void Trainer<Derived, Model, Policies...>::save_checkpoint() {
  acc_->settle_skip();
  best_.before_save(acc_->state());
  record_callback_states();
  acc_->save_state();
  last_saved_step_ = acc_->state().global_step;
  fire<event::on_save>();
}

template <class Derived, class Model, class... Policies>
void Trainer<Derived, Model, Policies...>::stop_for_preemption(int signal) {
  sync_tokens();
  if (last_saved_step_ != acc_->state().global_step) save_checkpoint();
  in_train_ = false;
  fire<event::on_train_end>();
  save_state();
  throw Preempted(signal, acc_->state().global_step,
                  checkpoint::checkpoint_dir(args_.output_dir, acc_->state().global_step).string());
}

template <class Derived, class Model, class... Policies>
void Trainer<Derived, Model, Policies...>::step_plateau(const Metrics& metrics) {
  if (!scheduler_ || !scheduler_->wants_metric()) return;
  std::string key = args_.metric_for_best_model.value_or("loss");
  if (key.rfind("eval_", 0) != 0) key = "eval_" + key;
  const auto value = metrics.get(key);
  check(value.has_value(), "reduce_lr_on_plateau needs the metric {} but evaluation produced no such metric{}", key,
        data_->eval.size() > 1 ? "; with several evaluation sets name one in --metric_for_best_model, "
                                 "e.g. eval_<set>_loss" : "");
  scheduler_->step_metric(*value);
}

template <class Derived, class Model, class... Policies>
template <class Batch>
Metrics Trainer<Derived, Model, Policies...>::evaluate_impl(const data::AnyDataset<Batch>& dataset, const std::string& prefix) {
  auto loader = call_hook<hook::get_eval_dataloader>(self(), dataset);
  const MemoryTracker memory(prefix, !args_.skip_memory_metrics && !in_train_, acc_->device());
  acc_->begin_evaluation();
  Metrics metrics = evaluation_loop<Batch>(loader, prefix).metrics;
  acc_->end_evaluation();
  memory.stop(metrics);
  {
    // As in HF, the evaluation's log sees the model in evaluation mode (HF's model.train()
    // waits for the next training_step): a log hook tells the two logs apart by it, as TRL's do.
    auto& module = detail::module_of(model_);
    const bool was_training = module.is_training();
    module.eval();
    const auto& history = acc_->state().log_history;
    const std::size_t logged = history.size();
    call_hook<hook::log>(self(), std::as_const(metrics));
    if (was_training) module.train();
    // What a log hook added to the entry comes back from evaluate(), as in HF, whose log()
    // overrides (TRL's) add their metrics to the very dict evaluate() returns.
    if (history.size() > logged)
      for (const auto& [key, value] : history.back().items())
        if (value.is_number() && key != "step" && key != "epoch" && !metrics.contains(key))
          metrics.set(key, value.template get<double>());
  }
  metrics.set("epoch", acc_->state().epoch);  // HF's log() adds it to the caller's metrics
  fire<event::on_evaluate>(metrics);
  return metrics;
}

template <class Derived, class Model, class... Policies>
template <class Batch>
PredictResult Trainer<Derived, Model, Policies...>::evaluation_loop(data::DataLoader<Batch>& loader, const std::string& prefix,
                                                                    bool predicting) {
  auto& module = detail::module_of(model_);
  // HF's bf16_full_eval / fp16_full_eval: outside training the model itself is cast; the
  // batch's floating fields follow it. Unlike HF, whose model stays cast, the parameters get
  // their float32 storage back when the evaluation ends: the optimizer holds them, and under
  // DDP and ZeRO they are views into the engine's buffers, which a cast would cut them from.
  std::optional<torch::ScalarType> full_eval;
  std::optional<detail::CastForEvaluation> cast;
  if (!in_train_ && (args_.bf16_full_eval || args_.fp16_full_eval)) {
    full_eval = args_.bf16_full_eval ? torch::kBFloat16 : torch::kHalf;
    cast.emplace(module, *full_eval);
  }
  const bool was_training = module.is_training();
  module.eval();
  const auto start = std::chrono::steady_clock::now();
  torch::NoGradGuard no_grad;
  // --batch_eval_metrics: compute_metrics per round, nothing kept (predict() keeps what it returns).
  const bool per_batch = args_.batch_eval_metrics;
  EvalAccumulator acc(args_, acc_->world(), acc_->sharding(), acc_->device(), loader.size(), !per_batch || predicting);
  eval_loader_info_ = {loader.size(), loader.num_examples(), loader.batch_size()};
  kwargs_.eval_dataloader = &eval_loader_info_;
  std::vector<int64_t> own;  // this rank's batches, in round order
  for (int64_t k = 0; k < acc.rounds(); ++k)
    if (const auto b = acc.batch_of(k)) own.push_back(*b);
  data::BatchPrefetcher<Batch> batches(loader, prefetch_options());
  batches.start(0, std::move(own));
  Metrics raw;
  // HF's batch_eval_metrics call, the same on every rank (round_prediction gathers the round).
  const auto batch_metrics = [&](int64_t k, const PredictionOutput* p, int64_t rows, const torch::Tensor& inputs) {
    if (auto pred = acc.round_prediction(k, p, rows, inputs, label_names_.size()))
      raw = call_hook<hook::compute_metrics>(self(), std::as_const(*pred), k + 1 == acc.rounds());
  };
  for (int64_t k = 0; k < acc.rounds(); ++k) {
    const auto b = acc.batch_of(k);
    if (!b) {
      if (acc_->forward_is_collective()) {
        Batch dummy = loader.batch(0);
        data::to_device(dummy, acc_->device());
        if (full_eval) data::cast_floating(dummy, *full_eval);
        (void)call_hook<hook::prediction_step>(self(), model_, dummy);
      }
      if (per_batch) batch_metrics(k, nullptr, 0, {});
      continue;
    }
    Batch batch = batches.next();  // loader.batch(*b)
    data::to_device(batch, acc_->device());
    if (full_eval) data::cast_floating(batch, *full_eval);
    const int64_t n = data::batch_rows(batch);
    PredictionOutput p = call_hook<hook::prediction_step>(self(), model_, batch);
    // HF applies preprocess_logits_for_metrics per batch, before the gather and the
    // concatenation, and only when there are logits (none with prediction_loss_only).
    if (!args_.prediction_loss_only && p.logits.defined()) {
      torch::Tensor kept =
          call_hook<hook::preprocess_logits_for_metrics>(self(), std::as_const(p.logits), std::as_const(p.labels));
      if (!kept.is_same(p.logits))
        check(kept.defined() && kept.dim() >= 1 && kept.size(0) == n,
              "preprocess_logits_for_metrics returned a tensor of shape {} for a batch of {} rows; its dim 0 must be "
              "the batch's rows, as the batches' outputs are concatenated along it (e.g. logits.argmax(-1))",
              kept.defined() ? c10::str(kept.sizes()) : std::string("undefined"), n);
      p.logits = std::move(kept);
    }
    acc.add(p, n, main_input(batch));
    acc.end_round(k);
    fire<event::on_prediction_step>();
    if (per_batch) batch_metrics(k, &p, n, main_input(batch));
  }
  PredictResult result = acc.finish();
  if (!per_batch && result.predictions.defined() && result.label_ids.defined()) {
    const EvalPrediction pred{result.predictions, result.label_ids, result.all_label_ids, result.inputs,
                              result.losses};
    raw = call_hook<hook::compute_metrics>(self(), std::as_const(pred));
  }
  result.metrics = acc.metrics(std::move(raw), prefix, start);
  if (was_training) module.train();
  return result;
}

template <class Derived, class Model, class... Policies>
template <class Cb>
void Trainer<Derived, Model, Policies...>::add_callback() {
  if constexpr (callbacks_type::template compiled<Cb>) {
    callbacks_.template enable<Cb>(true);
  } else {
    static_assert(std::is_base_of_v<TrainerCallback, Cb>,
                  "loom: add_callback<Cb>: Cb must derive from loom::TrainerCallback (or be a compiled callback)");
    callbacks_.add(std::make_shared<Cb>());
  }
}

template <class Derived, class Model, class... Policies>
template <class Cb>
std::shared_ptr<Cb> Trainer<Derived, Model, Policies...>::pop_callback() {
  static_assert(std::is_base_of_v<TrainerCallback, Cb>,
                "loom: pop_callback<Cb>: only run-time callbacks (loom::TrainerCallback) can be popped; "
                "remove_callback<Cb>() switches a compiled one off");
  return std::static_pointer_cast<Cb>(
      callbacks_.pop_if([](const std::shared_ptr<TrainerCallback>& c) { return dynamic_cast<Cb*>(c.get()) != nullptr; }));
}

template <class Derived, class Model, class... Policies>
template <class Cb>
void Trainer<Derived, Model, Policies...>::remove_callback() {
  if constexpr (callbacks_type::template compiled<Cb>) callbacks_.template enable<Cb>(false);
  else (void)pop_callback<Cb>();
}

template <class Derived, class Model, class... Policies>
Metrics Trainer<Derived, Model, Policies...>::evaluate(const std::string& metric_key_prefix) {
  using Batch = batch_type<>;
  check(!data_->eval.empty(), "evaluate() needs an evaluation dataset; pass one to the Trainer or to evaluate()");
  Metrics metrics;
  for (const auto& [name, dataset] : data_->eval)
    metrics.merge(evaluate_impl<Batch>(dataset, name.empty() ? metric_key_prefix : metric_key_prefix + "_" + name));
  return metrics;
}

template <class Derived, class Model, class... Policies>
template <data::Dataset D>
Metrics Trainer<Derived, Model, Policies...>::evaluate(D dataset, const std::string& metric_key_prefix) {
  using Batch = batch_type<D>;
  static_assert(std::is_same_v<data::batch_t<D>, Batch>,
                "loom: the evaluation dataset yields another batch type than compute_loss takes");
  return evaluate_impl<Batch>(data::AnyDataset<Batch>(std::move(dataset)), metric_key_prefix);
}

template <class Derived, class Model, class... Policies>
template <data::Dataset D>
Metrics Trainer<Derived, Model, Policies...>::evaluate(EvalDatasets<D> datasets, const std::string& metric_key_prefix) {
  Metrics metrics;
  for (auto& [name, dataset] : datasets) metrics.merge(evaluate(std::move(dataset), metric_key_prefix + "_" + name));
  return metrics;
}

template <class Derived, class Model, class... Policies>
template <class Batch>
int64_t Trainer<Derived, Model, Policies...>::input_tokens(const Batch& batch) const {
  if (args_.include_num_input_tokens_seen == "non_padding")
    if (const torch::Tensor* mask = data::field_named(batch, "attention_mask"); mask && mask->defined())
      return mask->sum().template item<int64_t>();
  return main_input(batch).numel();
}

}  // namespace loom
