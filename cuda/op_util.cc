#include "cuda/op_util.h"

#include "engine/device_layout.h"

namespace remat::cuda {

Strided layout_of(const char* op, const Tensor& t) {
  REMAT_CHECK(t.dim() <= kMaxDims, ShapeError, op, ": CUDA kernels take at most ", kMaxDims, " dims, got ",
              describe(t));
  return detail::device_layout(t);
}

}  // namespace remat::cuda
