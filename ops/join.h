// Joining and splitting along a dim: cat, stack, split. cat copies any dtype;
// floating inputs are differentiable (each input's gradient is its slice of
// the output gradient). split returns views (narrow), so it is differentiable
// like any view.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/tensor.h"
#include "ops/kernel_table.h"

namespace remat {

// Concatenates `xs` (at least one; same ndim >= 1, dtype and device; sizes
// equal except along `dim`) along `dim` into a new contiguous tensor.
Tensor cat(const std::vector<Tensor>& xs, std::int64_t dim);

// Views of `x` along `dim` in chunks of `split_size` (> 0); the last chunk is
// smaller when split_size does not divide the size. Note: split(x, {n}, d)
// with a one-element braced list picks this overload (chunks of n).
std::vector<Tensor> split(const Tensor& x, std::int64_t split_size, std::int64_t dim);
// Views of `x` along `dim` with the given sizes (each >= 0, summing to x.size(dim)).
std::vector<Tensor> split(const Tensor& x, const std::vector<std::int64_t>& sizes,
                          std::int64_t dim);

// Stacks `xs` (at least one, all the same shape) along a new dim `dim`
// (-(ndim+1)..ndim): cat of each input unsqueezed at `dim`.
Tensor stack(const std::vector<Tensor>& xs, std::int64_t dim);

// The kernel a device registers for cat (elements copied raw, any dtype).
struct CatKernels {
  // The concatenation of xs (one dtype and device; shapes checked) along d into a new contiguous tensor of `shape`.
  Tensor (*cat)(const std::vector<Tensor>& xs, std::int64_t d, const Shape& shape);
};
KernelTable<CatKernels>& cat_kernels();

}  // namespace remat
