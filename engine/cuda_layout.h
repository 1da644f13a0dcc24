// A tensor's layout as cuda/ kernels take it (internal to the engine and ops;
// public headers never include cuda/).
#pragma once

#include "cuda/strided.h"
#include "engine/tensor.h"

namespace remat::detail {

// t's sizes and strides in elements; throws ShapeError for more than
// cuda::kMaxDims dims.
cuda::Strided cuda_layout(const Tensor& t);

}  // namespace remat::detail
