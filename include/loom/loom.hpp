#pragma once
// The umbrella header: everything a program training with loom needs.

#include <loom/config/error.hpp>
#include <loom/config/reflect.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/config/validate.hpp>
#include <loom/core/error.hpp>
#include <loom/core/metrics.hpp>
#include <loom/core/state.hpp>
#include <loom/data/collate.hpp>
#include <loom/data/dataloader.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/idx.hpp>
#include <loom/data/sampler.hpp>
#include <loom/checkpoint/folders.hpp>
#include <loom/checkpoint/safetensors.hpp>
#include <loom/policy/bundle.hpp>
#include <loom/policy/tags.hpp>
#include <loom/schedule/from_args.hpp>
#include <loom/trainer/selector.hpp>
#include <loom/trainer/trainer.hpp>
