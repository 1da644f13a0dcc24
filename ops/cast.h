// Dtype conversion. Between floating dtypes (f32, bf16, f16) it is
// differentiable: the gradient is cast back to the input's dtype.
#pragma once

#include "engine/tensor.h"

namespace remat {

// x converted to `dtype` (rounding to nearest even; x itself if it already has
// that dtype). Throws DTypeError when x requires grad (with grad mode on) and
// `dtype` is not floating: detach() or use NoGradGuard to take such a copy.
Tensor cast(const Tensor& x, DType dtype);

}  // namespace remat
