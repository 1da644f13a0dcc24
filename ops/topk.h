// The k best entries along a dim, sorted best first. Deterministic: ties
// (equal values, including -0.0 == 0.0) go to the lower index, and NaN ranks
// above every number (first for largest, last for smallest), so a routing
// decision never depends on thread count or sort internals.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/tensor.h"
#include "ops/kernel_table.h"

namespace remat {

// (values, indices) of the k largest (or smallest) entries of floating x along
// `dim`: x's shape with size k at `dim`; indices are i64 and carry no grad.
// 0 <= k <= x.size(dim). The gradient of values flows to the picked entries.
std::pair<Tensor, Tensor> topk(const Tensor& x, std::int64_t k, std::int64_t dim = -1,
                               bool largest = true);

// The kernels a device registers for topk (d: a wrapped dim).
struct TopkKernels {
  // {values, i64 indices} of x's k best entries along d, best first.
  std::vector<Tensor> (*forward)(const Tensor& x, std::int64_t k, std::int64_t d, bool largest);
  // The values' gradient g placed at the picked entries of zeros [xs] (dtype: x's).
  Tensor (*backward)(const Tensor& g, const Tensor& indices, const Shape& xs, std::int64_t d, DType dtype);
};
KernelTable<TopkKernels>& topk_kernels();

}  // namespace remat
