// Reductions over dims. Sums accumulate in f32 with a fixed lane order, so
// results do not depend on thread count or memory alignment.
#pragma once

#include <utility>

#include "engine/tensor.h"

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

}  // namespace remat
