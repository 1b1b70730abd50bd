#pragma once
// precision::FP32: float32 everywhere; every hook is a no-op. PrecisionImpl<FP32> is
// AutocastPrecision<kFloat>, defined beside BF16's in autocast_precision.hpp.
#include <loom/precision/autocast_precision.hpp>
