// Precompiled for loom's own targets: the heavy, stable headers only.
#pragma once
#include <torch/torch.h>
#include <nlohmann/json.hpp>
