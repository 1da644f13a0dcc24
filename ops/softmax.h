// Softmax and log-softmax over one dim, numerically stable (the maximum of
// each slice is subtracted before exp). Floating dtypes; computed in f32, the
// result has the input's dtype and shape (contiguous).
#pragma once

#include <cstdint>

#include "engine/tensor.h"
#include "ops/kernel_table.h"

namespace remat {

// exp(x - max) / sum(exp(x - max)) over `dim` (negative counts from the end).
// Saves its output for backward.
Tensor softmax(const Tensor& x, std::int64_t dim = -1);
// x - max - log(sum(exp(x - max))) over `dim`. Saves its output for backward.
Tensor log_softmax(const Tensor& x, std::int64_t dim = -1);

// A tensor with the softmax dim moved last, as kernels take it: a [rows, n]
// matrix, and how to put a result of that layout back.
struct SoftmaxRows {
  std::int64_t dim = 0;
  bool moved = false;  // dim was not the last one
  Shape perm, inverse;
  std::int64_t rows = 0, n = 1;
};
// The rows of x over `dim` (wrapped); throws ShapeError naming `op` for a bad dim.
SoftmaxRows softmax_rows(const Tensor& x, std::int64_t dim, const char* op);

// The kernels a device registers for softmax and log_softmax. Results come
// back in x's layout (contiguous).
struct SoftmaxKernels {
  // softmax (or log_softmax when log) of x over l's dim.
  Tensor (*forward)(const Tensor& x, const SoftmaxRows& l, bool log);
  // dx from the output gradient g and the output y: y * (g - sum(g * y)) for
  // softmax, g - exp(y) * sum(g) for log_softmax. `dtype`: x's.
  Tensor (*backward)(const Tensor& g, const Tensor& y, const SoftmaxRows& l, bool log, DType dtype);
};
KernelTable<SoftmaxKernels>& softmax_kernels();

}  // namespace remat
