// Elementwise functions of one tensor. Floating dtypes; computed in f32.
#pragma once

#include <cstdint>

#include "engine/tensor.h"
#include "ops/kernel_table.h"

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

// The functions above, as their kernels take them.
enum class UnaryFn : std::uint8_t { neg, exp, log, sqrt, rsqrt, pow, abs, relu, gelu, silu, sigmoid, tanh };

// The kernels a device registers for the unary ops.
struct UnaryKernels {
  // out = f(x) element by element, x in any layout; param is pow's exponent.
  Tensor (*forward)(UnaryFn f, const Tensor& x, float param);
  // The gradient g * f'(...) from the tensor the op saved: its output y for
  // exp, sqrt, rsqrt, relu, sigmoid, tanh; its input x for log, pow, abs,
  // gelu, silu. (neg's gradient is neg(g), no kernel.) g and saved have one shape.
  Tensor (*backward)(UnaryFn f, const Tensor& g, const Tensor& saved, float param);
};
KernelTable<UnaryKernels>& unary_kernels();

}  // namespace remat
