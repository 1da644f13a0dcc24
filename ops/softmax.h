// Softmax and log-softmax over one dim, numerically stable (the maximum of
// each slice is subtracted before exp). Floating dtypes; computed in f32, the
// result has the input's dtype and shape (contiguous).
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace remat {

// exp(x - max) / sum(exp(x - max)) over `dim` (negative counts from the end).
// Saves its output for backward.
Tensor softmax(const Tensor& x, std::int64_t dim = -1);
// x - max - log(sum(exp(x - max))) over `dim`. Saves its output for backward.
Tensor log_softmax(const Tensor& x, std::int64_t dim = -1);

}  // namespace remat
