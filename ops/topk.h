// The k best entries along a dim, sorted best first. Deterministic: ties
// (equal values, including -0.0 == 0.0) go to the lower index, and NaN ranks
// above every number (first for largest, last for smallest), so a routing
// decision never depends on thread count or sort internals.
#pragma once

#include <cstdint>
#include <utility>

#include "engine/tensor.h"

namespace remat {

// (values, indices) of the k largest (or smallest) entries of floating x along
// `dim`: x's shape with size k at `dim`; indices are i64 and carry no grad.
// 0 <= k <= x.size(dim). The gradient of values flows to the picked entries.
std::pair<Tensor, Tensor> topk(const Tensor& x, std::int64_t k, std::int64_t dim = -1,
                               bool largest = true);

}  // namespace remat
