// Matrix products on f32 (16-bit inputs are computed in f32). Transposed
// operands (views such as w.t()) are passed to the GEMM as transposes, not
// copied.
#pragma once

#include "engine/tensor.h"

namespace remat {

// a [..., m, k] @ b [k, n] -> [..., m, n] (leading dims of a fold into m), or
// a [B..., m, k] @ b [B..., k, n] with identical batch dims (a batched product).
Tensor matmul(const Tensor& a, const Tensor& b);
// Batched product of 3-D tensors: [B, m, k] @ [B, k, n] -> [B, m, n].
Tensor bmm(const Tensor& a, const Tensor& b);
// x [..., in] @ w[out, in]^T (+ bias [out]) -> [..., out].
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor());

}  // namespace remat
