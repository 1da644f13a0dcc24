// Fused multi-tensor kernels for optimizers: one launch over many f32
// tensors on one CUDA device (the AdamW update, the sum of squares for norm
// clipping, an in-place scale). Deterministic: no atomics, fixed orders (see
// cuda/adamw.h). Not differentiable; train/optimizer.cc runs the CPU loops
// itself and calls these for its CUDA parameters. Every tensor must be a
// contiguous f32 tensor on `device`; anything else throws.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/tensor.h"
#include "ops/kernel_table.h"

namespace remat {

// One step's scalars, computed on the host exactly as the CPU AdamW does.
struct AdamWStepScalars {
  float beta1 = 0, beta2 = 0;
  float step_size = 0;     // lr / (1 - beta1^step)
  float inv_sqrt_bc2 = 0;  // 1 / sqrt(1 - beta2^step)
  float eps = 0;
};

// One parameter of a fused AdamW update (the same numel in all four).
struct AdamWTensors {
  Tensor param, grad, exp_avg, exp_avg_sq;
  float decay = 1.0f;  // the multiplicative weight decay (1 for none)
};

// For every element of every entry, in f32 with the CPU AdamW's exact
// operations and order:  m = b1*m + (1-b1)*g;  v = b2*v + ((1-b2)*g)*g;
// p = p*decay - (step_size*m) / (sqrt(v)*inv_sqrt_bc2 + eps). Does not bump
// versions. Empty entries are skipped.
void multi_tensor_adamw(const std::vector<AdamWTensors>& tensors, const AdamWStepScalars& s, Device device);

// The sum over every element of every tensor of double(x)^2, in double, in a
// fixed order; waits for the result.
double multi_tensor_sum_squares(const std::vector<Tensor>& tensors, Device device);

// x *= scale (f32) for every element of every tensor, in place (no version bump).
void multi_tensor_scale_(const std::vector<Tensor>& tensors, float scale, Device device);

// The kernels a device registers for the functions above (the same contracts).
struct MultiTensorKernels {
  void (*adamw)(const std::vector<AdamWTensors>& tensors, const AdamWStepScalars& s, Device device);
  double (*sum_squares)(const std::vector<Tensor>& tensors, Device device);
  void (*scale)(const std::vector<Tensor>& tensors, float scale, Device device);
};
KernelTable<MultiTensorKernels>& multi_tensor_kernels();

}  // namespace remat
