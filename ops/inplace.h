// In-place writes: each modifies x's elements (through any view, contiguous
// or not), bumps the version counter x shares with its base and views, and
// returns x. They are not differentiable: with grad mode on they refuse
// (AutogradError) a destination or operand that requires grad. A tensor an
// op saved for backward and later modified here makes that backward throw.
#pragma once

#include <cstdint>

#include "engine/tensor.h"
#include "ops/kernel_table.h"

namespace remat {

// x += alpha * y, with y (x's dtype and device) broadcast to x's shape; in f32.
Tensor& add_(Tensor& x, const Tensor& y, double alpha = 1.0);
// x *= s.
Tensor& mul_(Tensor& x, double s);
// x *= y, with y (x's dtype and device) broadcast to x's shape; in f32.
Tensor& mul_(Tensor& x, const Tensor& y);
// Sets every element of x (any dtype) to zero.
Tensor& zero_(Tensor& x);
// Copies src (broadcast to dst's shape, converted to dst's dtype) into dst.
Tensor& copy_(Tensor& dst, const Tensor& src);

enum class UpdateFn : std::uint8_t { add, mul, scale };

// The kernels a device registers for the in-place updates.
struct InplaceKernels {
  // In place through x's layout: x = x + alpha * y (add), x * y (mul) or
  // x * alpha (scale; y is x). y has x's sizes (broadcast by stride 0) and
  // does not overlap x except as x itself. Computed in f32, rounded to x's dtype.
  void (*update)(UpdateFn f, Tensor& x, const Tensor& y, float alpha);
};
KernelTable<InplaceKernels>& inplace_kernels();

}  // namespace remat
