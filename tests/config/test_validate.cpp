// Tests for config/validate.hpp: validate() rules and finalize() defaults.
#include <loom/config/validate.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>

namespace {

using loom::TrainingArguments;

// The message validate() throws, or "" when it accepts the arguments.
std::string validate_error(const TrainingArguments& args) {
  try {
    loom::validate(args);
  } catch (const loom::Error& e) {
    return e.what();
  }
  return "";
}

// Builds default arguments, applies `change`, and returns validate()'s message.
std::string error_after(const std::function<void(TrainingArguments&)>& change) {
  TrainingArguments args;
  change(args);
  return validate_error(args);
}

// Checks the message is one "loom: " line naming every flag in `flags`.
void check_names(const std::string& message, std::initializer_list<const char*> flags) {
  INFO("message: " << message);
  CHECK(message.starts_with("loom: "));
  CHECK(message.find('\n') == std::string::npos);
  for (const char* f : flags) CHECK(message.find(std::string("--") + f) != std::string::npos);
}

}  // namespace

TEST_CASE("validate: the defaults and common configurations pass") {
  CHECK(validate_error(TrainingArguments{}) == "");

  TrainingArguments steps;
  steps.eval_strategy = "steps";
  steps.eval_steps = 100;
  steps.save_steps = 500;
  steps.load_best_model_at_end = true;
  steps.metric_for_best_model = "accuracy";
  steps.max_steps = 1000;
  steps.num_train_epochs = 0;
  steps.warmup_steps = 0.1;
  steps.save_total_limit = 2;
  steps.bf16 = true;
  steps.lr_scheduler_type = "cosine_with_min_lr";
  steps.lr_scheduler_kwargs = R"({"min_lr": 1e-6})";
  CHECK(validate_error(steps) == "");

  TrainingArguments best;
  best.eval_strategy = "epoch";
  best.save_strategy = "best";
  best.metric_for_best_model = "eval_loss";
  best.load_best_model_at_end = true;
  CHECK(validate_error(best) == "");

  TrainingArguments fractions;  // both fractions of the run, save a multiple of eval
  fractions.eval_strategy = "steps";
  fractions.eval_steps = 0.1;
  fractions.save_steps = 0.3;
  fractions.load_best_model_at_end = true;
  CHECK(validate_error(fractions) == "");
}

TEST_CASE("validate: precision") {
  const auto m = error_after([](auto& a) { a.bf16 = a.fp16 = true; });
  CHECK(m == "loom: --bf16 and --fp16 cannot both be set; pick one");
}

TEST_CASE("validate: batch sizes and accumulation") {
  CHECK(error_after([](auto& a) { a.per_device_train_batch_size = 0; }) ==
        "loom: --per_device_train_batch_size must be positive, got 0");
  check_names(error_after([](auto& a) { a.per_device_eval_batch_size = -2; }), {"per_device_eval_batch_size"});
  check_names(error_after([](auto& a) { a.gradient_accumulation_steps = 0; }), {"gradient_accumulation_steps"});
  check_names(error_after([](auto& a) { a.eval_accumulation_steps = 0; }), {"eval_accumulation_steps"});
  CHECK(error_after([](auto& a) { a.eval_accumulation_steps = 1; }) == "");
  CHECK(error_after([](auto& a) { a.dataloader_num_workers = -1; }) ==
        "loom: --dataloader_num_workers must be >= 0, got -1");
  CHECK(error_after([](auto& a) { a.dataloader_prefetch_factor = 4; }) ==
        "loom: --dataloader_prefetch_factor needs --dataloader_num_workers > 0 (batches are read in the loop without "
        "workers)");
  CHECK(error_after([](auto& a) {
          a.dataloader_num_workers = 2;
          a.dataloader_prefetch_factor = 0;
        }) == "loom: --dataloader_prefetch_factor must be positive, got 0");
  CHECK(error_after([](auto& a) { a.bf16_full_eval = a.fp16_full_eval = true; }) ==
        "loom: --bf16_full_eval and --fp16_full_eval cannot both be set; pick one");
}

TEST_CASE("validate: optimizer numbers") {
  CHECK(error_after([](auto& a) { a.learning_rate = -1e-3; }) == "loom: --learning_rate must be >= 0, got -0.001");
  CHECK(error_after([](auto& a) { a.learning_rate = std::numeric_limits<double>::infinity(); }) ==
        "loom: --learning_rate must be a finite number, got inf");
  check_names(error_after([](auto& a) { a.learning_rate = std::nan(""); }), {"learning_rate"});
  check_names(error_after([](auto& a) { a.weight_decay = -0.1; }), {"weight_decay"});
  CHECK(error_after([](auto& a) { a.adam_beta1 = 1.0; }) == "loom: --adam_beta1 must be in [0, 1), got 1");
  check_names(error_after([](auto& a) { a.adam_beta1 = -0.1; }), {"adam_beta1"});
  check_names(error_after([](auto& a) { a.adam_beta2 = 1.5; }), {"adam_beta2"});
  CHECK(error_after([](auto& a) { a.adam_beta2 = 0.0; }) == "");
  check_names(error_after([](auto& a) { a.adam_epsilon = 0; }), {"adam_epsilon"});
  check_names(error_after([](auto& a) { a.max_grad_norm = -1; }), {"max_grad_norm"});
  CHECK(error_after([](auto& a) { a.max_grad_norm = 0; }) == "");  // 0 turns clipping off
}

TEST_CASE("validate: run length") {
  CHECK(error_after([](auto& a) { a.num_train_epochs = 0; }) ==
        "loom: --num_train_epochs must be positive when --max_steps is not set (> 0), got 0");
  CHECK(error_after([](auto& a) {
          a.num_train_epochs = 0;
          a.max_steps = 10;
        }) == "");
}

TEST_CASE("validate: names with suggestions") {
  CHECK(error_after([](auto& a) { a.eval_strategy = "step"; }) ==
        "loom: --eval_strategy must be one of no|steps|epoch, got 'step'; did you mean 'steps'?");
  CHECK(error_after([](auto& a) { a.logging_strategy = "epochs"; }) ==
        "loom: --logging_strategy must be one of no|steps|epoch, got 'epochs'; did you mean 'epoch'?");
  CHECK(error_after([](auto& a) { a.save_strategy = "bestt"; }) ==
        "loom: --save_strategy must be one of no|steps|epoch|best, got 'bestt'; did you mean 'best'?");
  CHECK(error_after([](auto& a) { a.optim = "adamw"; }) ==
        "loom: --optim must be one of adamw_torch_fused|adamw_torch|adafactor|sgd|adagrad|rmsprop|lion, got 'adamw'; "
        "did you mean 'adamw_torch'?");
  CHECK(error_after([](auto& a) { a.sharding = "zero3"; }) ==
        "loom: --sharding must be one of no|ddp|zero1|zero2|full_shard|auto, got 'zero3'; did you mean 'zero1'?");
  const auto sched = error_after([](auto& a) { a.lr_scheduler_type = "cosine_with_restart"; });
  check_names(sched, {"lr_scheduler_type"});
  CHECK(sched.ends_with("got 'cosine_with_restart'; did you mean 'cosine_with_restarts'?"));
  const auto far = error_after([](auto& a) { a.lr_scheduler_type = "banana"; });
  check_names(far, {"lr_scheduler_type"});
  CHECK(far.find("did you mean") == std::string::npos);
  for (const char* name : {"linear", "cosine", "cosine_with_restarts", "polynomial", "constant",
                           "constant_with_warmup", "inverse_sqrt", "cosine_with_min_lr", "cosine_warmup_with_min_lr",
                           "warmup_stable_decay"}) {
    INFO(name);
    CHECK(error_after([&](auto& a) { a.lr_scheduler_type = name; }) == "");
  }
}

TEST_CASE("validate: lr_scheduler_kwargs must be a JSON object") {
  check_names(error_after([](auto& a) { a.lr_scheduler_kwargs = "[1]"; }), {"lr_scheduler_kwargs"});
  check_names(error_after([](auto& a) { a.lr_scheduler_kwargs = "{num_cycles: 2"; }), {"lr_scheduler_kwargs"});
  check_names(error_after([](auto& a) { a.lr_scheduler_kwargs = ""; }), {"lr_scheduler_kwargs"});
  CHECK(error_after([](auto& a) { a.lr_scheduler_kwargs = R"({"num_cycles": 2})"; }) == "");
}

TEST_CASE("validate: warmup") {
  CHECK(error_after([](auto& a) { a.warmup_ratio = 1.5; }) == "loom: --warmup_ratio must be in [0, 1], got 1.5");
  check_names(error_after([](auto& a) { a.warmup_ratio = -0.1; }), {"warmup_ratio"});
  check_names(error_after([](auto& a) { a.warmup_steps = -1; }), {"warmup_steps"});
  check_names(error_after([](auto& a) {
                a.warmup_ratio = 0.1;
                a.warmup_steps = 10;
              }),
              {"warmup_ratio", "warmup_steps"});
  CHECK(error_after([](auto& a) { a.warmup_ratio = 0.1; }) == "");
}

TEST_CASE("validate: logging, eval and save intervals") {
  CHECK(error_after([](auto& a) { a.logging_steps = 0; }) == "loom: --logging_steps must be positive, got 0");
  CHECK(error_after([](auto& a) {
          a.logging_steps = 0;
          a.logging_strategy = "epoch";
        }) == "");
  check_names(error_after([](auto& a) { a.logging_steps = 2.5; }), {"logging_steps"});
  CHECK(error_after([](auto& a) { a.save_steps = 0; }) == "loom: --save_steps must be positive, got 0");
  CHECK(error_after([](auto& a) {
          a.save_steps = 0;
          a.save_strategy = "no";
        }) == "");
  check_names(error_after([](auto& a) { a.save_steps = 10.5; }), {"save_steps"});
  CHECK(error_after([](auto& a) { a.eval_steps = 0; }) == "loom: --eval_steps must be positive, got 0");
  check_names(error_after([](auto& a) { a.eval_steps = -5; }), {"eval_steps"});
  check_names(error_after([](auto& a) {
                a.eval_strategy = "steps";
                a.eval_steps = 7.5;
              }),
              {"eval_steps"});
  CHECK(error_after([](auto& a) { a.save_total_limit = 0; }) == "loom: --save_total_limit must be positive, got 0");
  check_names(error_after([](auto& a) { a.eval_delay = -1; }), {"eval_delay"});
}

TEST_CASE("validate: eval_strategy steps needs eval_steps or logging_steps") {
  const auto m = error_after([](auto& a) {
    a.eval_strategy = "steps";
    a.logging_strategy = "no";
    a.logging_steps = 0;
  });
  check_names(m, {"eval_strategy", "eval_steps", "logging_steps"});
  // logging_steps stands in for a missing eval_steps.
  CHECK(error_after([](auto& a) { a.eval_strategy = "steps"; }) == "");
}

TEST_CASE("validate: load_best_model_at_end") {
  CHECK(error_after([](auto& a) { a.load_best_model_at_end = true; }) ==
        "loom: --load_best_model_at_end requires the save and eval strategy to match (or --save_strategy best), "
        "got --eval_strategy no and --save_strategy steps");
  check_names(error_after([](auto& a) {
                a.load_best_model_at_end = true;
                a.eval_strategy = "epoch";
                a.save_strategy = "steps";
              }),
              {"load_best_model_at_end", "eval_strategy", "save_strategy"});
  CHECK(error_after([](auto& a) {
          a.load_best_model_at_end = true;
          a.eval_strategy = "steps";
          a.eval_steps = 300;
          a.save_steps = 500;
        }) ==
        "loom: --load_best_model_at_end requires --save_steps to be a multiple of --eval_steps, got --save_steps 500 "
        "and --eval_steps 300");
  // Without eval_steps, logging_steps (500 by default) is the interval: 500 | 1000.
  CHECK(error_after([](auto& a) {
          a.load_best_model_at_end = true;
          a.eval_strategy = "steps";
          a.save_steps = 1000;
        }) == "");
  check_names(error_after([](auto& a) {
                a.load_best_model_at_end = true;
                a.eval_strategy = "steps";
                a.eval_steps = 0.1;
                a.save_steps = 100;
              }),
              {"load_best_model_at_end", "save_steps", "eval_steps"});
  check_names(error_after([](auto& a) {
                a.load_best_model_at_end = true;
                a.eval_strategy = "steps";
                a.eval_steps = 0.2;
                a.save_steps = 0.3;
              }),
              {"save_steps", "eval_steps"});
}

TEST_CASE("validate: save_strategy best") {
  CHECK(error_after([](auto& a) {
          a.save_strategy = "best";
          a.eval_strategy = "epoch";
        }) == "loom: --save_strategy best needs --metric_for_best_model");
  check_names(error_after([](auto& a) {
                a.save_strategy = "best";
                a.metric_for_best_model = "accuracy";
              }),
              {"save_strategy", "eval_strategy"});
}

TEST_CASE("validate: reduce_lr_on_plateau needs evaluation") {
  check_names(error_after([](auto& a) { a.lr_scheduler_type = "reduce_lr_on_plateau"; }),
              {"lr_scheduler_type", "eval_strategy"});
  CHECK(error_after([](auto& a) {
          a.lr_scheduler_type = "reduce_lr_on_plateau";
          a.eval_strategy = "epoch";
        }) == "");
}

TEST_CASE("validate: seeds, distributed and output_dir") {
  CHECK(error_after([](auto& a) { a.seed = -1; }) == "loom: --seed must be >= 0, got -1");
  check_names(error_after([](auto& a) { a.data_seed = -3; }), {"data_seed"});
  CHECK(error_after([](auto& a) { a.ddp_timeout = 0; }) == "loom: --ddp_timeout must be positive, got 0");
  check_names(error_after([](auto& a) { a.ddp_bucket_cap_mb = 0; }), {"ddp_bucket_cap_mb"});
  CHECK(error_after([](auto& a) { a.ddp_bucket_cap_mb = 25; }) == "");
  CHECK(error_after([](auto& a) { a.output_dir = ""; }) == "loom: --output_dir must not be empty");
}

TEST_CASE("validate: any non-finite floating setting") {
  CHECK(error_after([](auto& a) { a.eval_steps = std::numeric_limits<double>::infinity(); }) ==
        "loom: --eval_steps must be a finite number, got inf");
  check_names(error_after([](auto& a) { a.num_train_epochs = std::nan(""); }), {"num_train_epochs"});
}

// ---- finalize -------------------------------------------------------------------------

TEST_CASE("finalize: eval_steps defaults to logging_steps for eval_strategy steps") {
  TrainingArguments a;
  a.eval_strategy = "steps";
  a.logging_steps = 25;
  loom::finalize(a);
  CHECK(a.eval_steps == std::optional<double>(25));
  CHECK(a.do_eval);  // HF: evaluating during training implies do_eval

  TrainingArguments given;
  given.eval_strategy = "steps";
  given.eval_steps = 10;
  loom::finalize(given);
  CHECK(given.eval_steps == std::optional<double>(10));

  TrainingArguments epoch;
  epoch.eval_strategy = "epoch";
  loom::finalize(epoch);
  CHECK_FALSE(epoch.eval_steps.has_value());

  TrainingArguments none;
  loom::finalize(none);
  CHECK_FALSE(none.do_eval);
  CHECK_FALSE(none.eval_steps.has_value());
}

TEST_CASE("finalize: metric_for_best_model and greater_is_better") {
  TrainingArguments best;
  best.load_best_model_at_end = true;
  loom::finalize(best);
  CHECK(best.metric_for_best_model == std::optional<std::string>("loss"));
  CHECK(best.greater_is_better == std::optional<bool>(false));

  TrainingArguments accuracy;
  accuracy.metric_for_best_model = "accuracy";
  loom::finalize(accuracy);
  CHECK(accuracy.greater_is_better == std::optional<bool>(true));

  TrainingArguments eval_loss;
  eval_loss.metric_for_best_model = "eval_loss";
  loom::finalize(eval_loss);
  CHECK(eval_loss.greater_is_better == std::optional<bool>(false));

  TrainingArguments kept;  // an explicit choice is kept
  kept.metric_for_best_model = "perplexity";
  kept.greater_is_better = false;
  loom::finalize(kept);
  CHECK(kept.greater_is_better == std::optional<bool>(false));

  TrainingArguments plateau;
  plateau.lr_scheduler_type = "reduce_lr_on_plateau";
  loom::finalize(plateau);
  CHECK(plateau.metric_for_best_model == std::optional<std::string>("loss"));

  TrainingArguments untouched;
  loom::finalize(untouched);
  CHECK_FALSE(untouched.metric_for_best_model.has_value());
  CHECK_FALSE(untouched.greater_is_better.has_value());
}

TEST_CASE("finalize then validate: load_best_model_at_end with matching epochs") {
  TrainingArguments a;
  a.load_best_model_at_end = true;
  a.eval_strategy = "epoch";
  a.save_strategy = "epoch";
  loom::finalize(a);
  CHECK(validate_error(a) == "");
  CHECK(a.metric_for_best_model == std::optional<std::string>("loss"));
}
