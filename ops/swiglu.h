// SwiGLU gating: silu(gate) * up as one fused op with a fused backward.
#pragma once

#include <vector>

#include "engine/tensor.h"
#include "ops/kernel_table.h"

namespace remat {

// gate * sigmoid(gate) * up, elementwise. gate and up: same shape, dtype and
// device (floating); computed in f32. Saves gate and up for backward.
Tensor swiglu(const Tensor& gate, const Tensor& up);

// The kernels a device registers for swiglu.
struct SwigluKernels {
  // out = gate / (1 + exp(-gate)) * up; gate and up in any layout.
  Tensor (*forward)(const Tensor& gate, const Tensor& up);
  // {dgate, dup} with s = sigmoid(gate): dgate = dy * up * s * (1 + gate * (1 - s))
  // (when need_dgate; up is undefined otherwise), dup = dy * gate * s (when need_dup).
  // dy_writable: nothing else reads dy (OpBackward::grad_writable), so dup
  // may be written into its buffer (the backward then holds one gate-sized
  // buffer fewer).
  std::vector<Tensor> (*backward)(const Tensor& dy, const Tensor& gate, const Tensor& up, bool need_dgate,
                                  bool need_dup, bool dy_writable);
};
KernelTable<SwigluKernels>& swiglu_kernels();

}  // namespace remat
