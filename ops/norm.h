// Normalisations over the last dim: RMSNorm and LayerNorm, each one fused op
// with a fused backward. Floating dtypes (x and the affine parameters share
// x's dtype); statistics and results are computed in f32, the output has x's
// dtype and shape. Parameter gradients sum over rows in a fixed order, so
// they do not depend on the thread count.
#pragma once

#include <vector>

#include "engine/tensor.h"
#include "ops/kernel_table.h"

namespace remat {

// x [..., d], weight [d]: x * rsqrt(mean(x^2, -1) + eps) * weight. Saves x,
// weight and the per-row rstd (f32, one value per row) for backward.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-5);

// The residual add and the RMSNorm after it as one fused op
// ("add_rms_norm"), for pre-norm blocks: h = x + residual and
// y = rms_norm(h, weight, eps).
struct AddRmsNorm {
  Tensor h;  // x + residual
  Tensor y;  // rms_norm(h, weight, eps)
};
// x and residual: the same shape [..., d], dtype (floating) and device (no
// broadcasting); weight [d] in x's dtype. On the CPU, h has the bits of
// add(x, residual) and y those of rms_norm(add(x, residual), weight, eps),
// computed in one pass over each row (CUDA runs the add and RMSNorm kernels
// back to back, with the same bits as those two ops). Backward: x and
// residual get the same gradient tensor, grad_h plus the RMSNorm part (one
// pass per row); the weight gradient sums over rows in rms_norm's fixed
// order. Saves h, weight and the per-row rstd, as the unfused pair does.
AddRmsNorm add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                        double eps = 1e-5);
// x [..., d]: (x - mean) * rsqrt(var + eps) * weight + bias over the last dim
// (biased variance). weight and bias [d] may each be undefined (no scale / no
// shift). Saves x, weight and the per-row mean and rstd (f32) for backward.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

// The kernels a device registers for rms_norm and layer_norm. x [rows.., d];
// statistics are f32, one per row.
struct NormKernels {
  // {y, rstd}: y = x * rstd * weight.
  std::vector<Tensor> (*rms_forward)(const Tensor& x, const Tensor& weight, float eps);
  // {dx, dw} (each undefined unless asked for; weight is undefined without dx).
  std::vector<Tensor> (*rms_backward)(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                                      bool need_dx, bool need_dw);
  // {y, mean, rstd}; weight and bias may be undefined.
  std::vector<Tensor> (*ln_forward)(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps);
  // {dx, dw, db}; x, mean and rstd are undefined when only db is asked for,
  // weight when dx is not. `dtype`: x's dtype.
  std::vector<Tensor> (*ln_backward)(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                     const Tensor& rstd, DType dtype, bool need_dx, bool need_dw, bool need_db);
};
KernelTable<NormKernels>& norm_kernels();

// The kernels a device registers for add_rms_norm (they take the operands'
// own dtypes on every device).
struct AddRmsNormKernels {
  // {h, y, rstd}.
  std::vector<Tensor> (*forward)(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps);
  // {dh, dw} from the gradients of h and y; weight is undefined without dh.
  std::vector<Tensor> (*backward)(const Tensor& gh, const Tensor& gy, const Tensor& h, const Tensor& weight,
                                  const Tensor& rstd, bool need_dh, bool need_dw);
};
KernelTable<AddRmsNormKernels>& add_rms_norm_kernels();

}  // namespace remat
