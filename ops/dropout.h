// Dropout with a memory-free backward: the keep mask is a pure function of
// the Philox state the forward drew from, so the node stores that state
// (seed, offset) and p instead of a mask and regenerates the mask in backward.
#pragma once

#include "engine/rng.h"
#include "engine/tensor.h"
#include "ops/kernel_table.h"

namespace remat {

// Zeroes element i of `x` when the Philox uniform u_i < p and scales the kept
// elements by 1 / (1 - p). The draw is `gen->reserve(x.numel())` (the default
// generator of x's device when gen is null); element i (row-major) uses word i
// of that draw, so restoring the generator's state replays the same mask.
// With !training or p == 0 returns `x` itself. p must be in [0, 1).
Tensor dropout(const Tensor& x, double p, bool training = true, Generator* gen = nullptr);

// Which part of the tensor one process draws a mask for `x` is: each row of
// x (dim 0) is piece `index` of `pieces` equal consecutive pieces of a row
// of it (a sequence-parallel rank's [B, S/T, d] of [B, S, d]).
struct RowPiece {
  std::int64_t index = 0, pieces = 1;
};
// dropout() of the default generator whose draw covers the whole rows
// (pieces x x.numel() values, a data-parallel rank's share under
// RngShardScope), x taking its pieces' words: the values one process's
// dropout gives those elements. A row piece's elements must be a multiple
// of 4 (ShapeError otherwise, naming the shapes).
Tensor dropout(const Tensor& x, double p, bool training, RowPiece piece);

// The kernel a device registers for dropout (forward and backward alike).
struct DropoutKernels {
  // x (any layout) times the mask of Philox stream `state`, scaled by
  // 1 / (1 - p): out[i] = (u_i >= p) ? x[i] * scale : 0, with u_i the
  // stream's i-th uniform (the same words on every device).
  Tensor (*apply)(const Tensor& x, double p, RngState state);
};
KernelTable<DropoutKernels>& dropout_kernels();

}  // namespace remat
