// Rotary position embedding (RoPE), "rotate half" convention as in Hugging
// Face Llama. Saves nothing for backward: the gradient is the inverse rotation.
#pragma once

#include <cstdint>

#include "engine/tensor.h"
#include "ops/kernel_table.h"

namespace remat {

// x [..., S, D] with D even; row s sits at position position_offset + s and
// pair i (x[..., i], x[..., D/2 + i]) is rotated by angle pos * theta^(-2i/D)
// (angles computed in double). theta must be positive.
Tensor rotary_embedding(const Tensor& x, double theta = 10000.0, std::int64_t position_offset = 0);

// The kernel a device registers for rotary_embedding.
struct RotaryKernels {
  // Every row of x [..., S, D] (any layout) rotated by its position's angles
  // (position_offset + s, frequencies theta^(-2i/D), cos / sin computed in
  // double); sign -1 rotates backwards (the inverse: the gradient).
  Tensor (*rotate)(const Tensor& x, double theta, std::int64_t position_offset, float sign);
};
KernelTable<RotaryKernels>& rotary_kernels();

}  // namespace remat
