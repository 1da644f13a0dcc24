// Reductions over dims. Sums accumulate in f32 with a fixed lane order, so
// results do not depend on thread count or memory alignment.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/tensor.h"
#include "ops/kernel_table.h"

namespace remat {

// Sum over `dims` (negative dims count from the end); keepdim keeps them as size 1.
Tensor sum(const Tensor& x, const Shape& dims, bool keepdim = false);
// Sum of all elements (a 0-dim tensor).
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x, const Shape& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
// Maximum over `dim` and the index of its first occurrence (i64). The
// gradient flows to that index.
std::pair<Tensor, Tensor> max(const Tensor& x, std::int64_t dim, bool keepdim = false);
// Maximum over `dim` (values only).
Tensor amax(const Tensor& x, std::int64_t dim, bool keepdim = false);

// The kernels a device registers for the reductions. rd: the reduced dims,
// sorted and distinct.
struct ReduceKernels {
  // The sum over rd times `scale` (x's shape without rd, or with size 1 there when keepdim).
  Tensor (*sum)(const Tensor& x, const std::vector<std::int64_t>& rd, bool keepdim, float scale);
  // {values, i64 index of the first maximum} over rd (one dim, or none for a 0-dim x; NaN is the largest).
  std::vector<Tensor> (*max)(const Tensor& x, const std::vector<std::int64_t>& rd, bool keepdim);
  // max's input gradient [xs]: g at each row's index along d, zeros elsewhere
  // (dtype: the input's, or f32 for the runner to round).
  Tensor (*max_backward)(const Tensor& g, const Tensor& index, const Shape& xs, std::int64_t d, bool keepdim,
                         DType dtype);
};
KernelTable<ReduceKernels>& reduce_kernels();

}  // namespace remat
