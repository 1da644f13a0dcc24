// Normalisations over the last dim: RMSNorm and LayerNorm, each one fused op
// with a fused backward. Floating dtypes (x and the affine parameters share
// x's dtype); statistics and results are computed in f32, the output has x's
// dtype and shape. Parameter gradients sum over rows in a fixed order, so
// they do not depend on the thread count.
#pragma once

#include "engine/tensor.h"

namespace remat {

// x [..., d], weight [d]: x * rsqrt(mean(x^2, -1) + eps) * weight. Saves x,
// weight and the per-row rstd (f32, one value per row) for backward.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-5);
// x [..., d]: (x - mean) * rsqrt(var + eps) * weight + bias over the last dim
// (biased variance). weight and bias [d] may each be undefined (no scale / no
// shift). Saves x, weight and the per-row mean and rstd (f32) for backward.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

}  // namespace remat
