#pragma once
// precision::BF16: forward and loss under bfloat16 autocast (CPU or CUDA); parameters,
// gradients and optimizer state stay float32, so no loss scaling is needed.
// PrecisionImpl<BF16> is AutocastPrecision<kBFloat16>, defined in autocast_precision.hpp.
#include <loom/precision/autocast_precision.hpp>
