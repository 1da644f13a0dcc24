// SwiGLU gating: silu(gate) * up as one fused op with a fused backward.
#pragma once

#include "engine/tensor.h"

namespace remat {

// gate * sigmoid(gate) * up, elementwise. gate and up: same shape, dtype and
// device (floating); computed in f32. Saves gate and up for backward.
Tensor swiglu(const Tensor& gate, const Tensor& up);

}  // namespace remat
