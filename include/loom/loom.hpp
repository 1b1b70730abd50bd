#pragma once
// The umbrella header: everything a program training with loom needs. Not here:
// <loom/distributed/comm.hpp> (dist::Comm, the process group's collectives, for a program that
// calls them itself: accelerator.sharding().comm()), so that editing it rebuilds loom::compiled
// and not every program; and <loom/models/...> (HF's models).

#include <loom/callbacks/default_flow.hpp>
#include <loom/callbacks/early_stopping.hpp>
#include <loom/callbacks/jsonl_logger.hpp>
#include <loom/callbacks/progress.hpp>
#include <loom/callbacks/tensorboard.hpp>
#include <loom/config/error.hpp>
#include <loom/config/reflect.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/config/validate.hpp>
#include <loom/core/deferred.hpp>
#include <loom/core/error.hpp>
#include <loom/core/metrics.hpp>
#include <loom/core/state.hpp>
#include <loom/data/collate.hpp>
#include <loom/data/dataloader.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/idx.hpp>
#include <loom/data/iterable.hpp>
#include <loom/data/mlm.hpp>
#include <loom/data/padding.hpp>
#include <loom/data/sampler.hpp>
#include <loom/data/text.hpp>
#include <loom/data/sft.hpp>
#include <loom/data/token_file.hpp>
#include <loom/data/token_stream.hpp>
#include <loom/distributed/env.hpp>
#include <loom/distributed/sharding.hpp>
#include <loom/checkpoint/folders.hpp>
#include <loom/checkpoint/safetensors.hpp>
#include <loom/metrics/classification.hpp>
#include <loom/metrics/memory.hpp>
#include <loom/metrics/regression.hpp>
#include <loom/metrics/speed.hpp>
#include <loom/metrics/text.hpp>
#include <loom/peft/lora_arguments.hpp>
#include <loom/policy/bundle.hpp>
#include <loom/policy/tags.hpp>
#include <loom/precision/bf16.hpp>
#include <loom/precision/fp16.hpp>
#include <loom/precision/fp32.hpp>
#include <loom/schedule/from_args.hpp>
#include <loom/trainer/hyperparameter_search.hpp>
#include <loom/trainer/run_main.hpp>
#include <loom/trainer/selector.hpp>
#include <loom/trainer/trainer.hpp>
