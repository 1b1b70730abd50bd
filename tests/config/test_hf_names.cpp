// HF command lines that carry over (issue 11): HF 4's names (--evaluation_strategy,
// --group_by_length), --local_rank from torch.distributed.launch, --resume_from_checkpoint
// True, bool --include_num_input_tokens_seen; --fsdp's words; bad values of the new settings,
// each one loom: line.
#include <loom/config/reflect.hpp>
#include <loom/config/validate.hpp>

#include <doctest/doctest.h>

#include "parse_support.hpp"

#include <string>
#include <vector>

using config_test::error_of;
using config_test::parsed;
using loom::TrainingArguments;

TEST_CASE("HF 4's --evaluation_strategy and --group_by_length move to today's names") {
  const auto a = parsed({"--evaluation_strategy", "steps", "--eval_steps", "10"});
  CHECK(a.eval_strategy == "steps");
  CHECK_FALSE(a.evaluation_strategy.has_value());
  CHECK(a.do_eval);  // HF's post-init rule follows the moved name
  CHECK(parsed({"--evaluation_strategy", "epoch", "--eval_strategy", "epoch"}).eval_strategy == "epoch");
  // HF 4 copied evaluation_strategy over eval_strategy (a program's own default included).
  CHECK(parsed({"--evaluation_strategy", "steps", "--eval_strategy", "epoch"}).eval_strategy == "steps");
  CHECK(error_of({"--evaluation_strategy", "epochs"}) ==
        "loom: --evaluation_strategy must be one of no|steps|epoch, got 'epochs'; did you mean 'epoch'?");
  // The moved name is checked like the real one: reduce_lr_on_plateau needs evaluation.
  CHECK(error_of({"--evaluation_strategy", "epoch", "--lr_scheduler_type", "reduce_lr_on_plateau"}).empty());

  const auto g = parsed({"--group_by_length"});
  CHECK(g.train_sampling_strategy == "group_by_length");
  CHECK(parsed({"--train_sampling_strategy", "group_by_length"}).group_by_length);
  CHECK(parsed({"--group_by_length", "--train_sampling_strategy", "sequential"}).train_sampling_strategy ==
        "group_by_length");
}

TEST_CASE("torch.distributed.launch's --local-rank is accepted; --resume_from_checkpoint True is the last checkpoint") {
  CHECK(parsed({"--local-rank=1"}).local_rank == 1);
  CHECK(parsed({"--local_rank", "0"}).local_rank == 0);
  CHECK(error_of({"--local_rank", "-2"}) == "loom: --local_rank must be -1 or a rank, got -2");
  CHECK(parsed({"--resume_from_checkpoint", "True"}).resume_from_checkpoint == "latest");
  CHECK(parsed({"--resume_from_checkpoint", "true"}).resume_from_checkpoint == "latest");
  CHECK_FALSE(parsed({"--resume_from_checkpoint", "False"}).resume_from_checkpoint.has_value());
  CHECK(parsed({"--resume_from_checkpoint", "out/checkpoint-5"}).resume_from_checkpoint == "out/checkpoint-5");
  CHECK(error_of({"--resume_from_checkpoint="}) ==
        "loom: --resume_from_checkpoint must name a checkpoint folder, latest or true");
  // HF: a bool include_num_input_tokens_seen means all / no.
  CHECK(parsed({"--include_num_input_tokens_seen", "True"}).include_num_input_tokens_seen == "all");
  CHECK(parsed({"--include_num_input_tokens_seen", "false"}).include_num_input_tokens_seen == "no");
  CHECK(parsed({"--include_num_input_tokens_seen", "non_padding"}).include_num_input_tokens_seen == "non_padding");
}

TEST_CASE("--fsdp words choose loom's sharding (tests/config/test_launcher_configs.cpp has the rest)") {
  CHECK(parsed({"--fsdp", "full_shard"}).sharding == "full_shard");
  CHECK(parsed({"--fsdp", "shard_grad_op"}).sharding == "zero2");
  CHECK(parsed({"--fsdp", "full_shard auto_wrap"}).sharding == "full_shard");
  CHECK(error_of({"--fsdp", "hybrid_shard"}).rfind("loom: --fsdp hybrid_shard: hybrid_shard is not honoured", 0) == 0);
  CHECK(error_of({"--fsdp", "false"}).empty());
  CHECK(error_of({"--fsdp="}).empty());
}

TEST_CASE("report_to, log levels, include_for_metrics and label_names: bad values are loom: lines") {
  CHECK(error_of({"--report_to", "wandb"}) ==
        "loom: --report_to wandb is not built in; loom reports to tensorboard and jsonl (all: both, none: neither)");
  CHECK(error_of({"--report_to", "none,jsonl"}) == "loom: --report_to none,jsonl: none and all stand alone");
  CHECK(error_of({"--report_to", "jsonl,jsonl"}) == "loom: --report_to names 'jsonl' twice");
  CHECK(error_of({"--report_to", "tensorboard, jsonl"}).empty());
  CHECK(error_of({"--log_level", "verbose"}).starts_with(
      "loom: --log_level must be one of debug|info|warning|error|critical|passive, got 'verbose'"));
  CHECK(error_of({"--log_level_replica", "loud"}).starts_with("loom: --log_level_replica must be one of"));
  CHECK(error_of({"--include_for_metrics", "inputs,loss"}).empty());
  CHECK(loom::detail::split_list(" a, b ,,c ") == std::vector<std::string>{"a", "b", "c"});
  TrainingArguments none;
  CHECK(loom::detail::label_names_of(none) == std::vector<std::string>{"labels"});
  none.label_names = "start_positions, end_positions";
  CHECK(loom::detail::label_names_of(none) == std::vector<std::string>{"start_positions", "end_positions"});
}
