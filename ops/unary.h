// Elementwise functions of one tensor. Floating dtypes; computed in f32.
#pragma once

#include "engine/tensor.h"

namespace remat {

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
// Natural log; log of a non-positive value is -inf / NaN as in IEEE.
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
// 1 / sqrt(x).
Tensor rsqrt(const Tensor& x);
// x ** p for a scalar exponent p.
Tensor pow(const Tensor& x, double p);
Tensor abs(const Tensor& x);
Tensor relu(const Tensor& x);
// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
Tensor gelu(const Tensor& x);
// SiLU (swish): x * sigmoid(x).
Tensor silu(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);

inline Tensor operator-(const Tensor& x) { return neg(x); }

}  // namespace remat
