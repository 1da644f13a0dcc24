// Dropout with a memory-free backward: the keep mask is a pure function of
// the Philox state the forward drew from, so the node stores that state
// (seed, offset) and p instead of a mask and regenerates the mask in backward.
#pragma once

#include "engine/rng.h"
#include "engine/tensor.h"

namespace remat {

// Zeroes element i of `x` when the Philox uniform u_i < p and scales the kept
// elements by 1 / (1 - p). The draw is `gen->reserve(x.numel())` (the default
// generator of x's device when gen is null); element i (row-major) uses word i
// of that draw, so restoring the generator's state replays the same mask.
// With !training or p == 0 returns `x` itself. p must be in [0, 1).
Tensor dropout(const Tensor& x, double p, bool training = true, Generator* gen = nullptr);

}  // namespace remat
