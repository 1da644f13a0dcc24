// dropout's CUDA kernel (cuda/dropout.h) registered for ops/dropout.h: the
// same Philox words as the CPU's, x read through its strides.
#include <cmath>

#include "cuda/dropout.h"
#include "cuda/op_util.h"
#include "ops/dropout.h"

namespace remat::cuda {
namespace {

Tensor apply(const Tensor& x, double p, RngState state) {
  // u = (w >> 8) / 2^24 exactly, so u >= p  <=>  (w >> 8) >= ceil(p * 2^24).
  const auto threshold = std::uint32_t(std::ceil(p * 16777216.0));
  const float scale = float(1.0 / (1.0 - p));
  Tensor xd = x.detach();
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype(), x.device()));
  dropout(out.raw_data(), xd.raw_data(), layout_of("dropout", xd), x.dtype(), state.seed, state.offset, threshold,
          scale, op_stream());
  return out;
}

const KernelRegistration<DropoutKernels> kCuda(dropout_kernels(), DeviceType::CUDA, {apply}, KernelDTypes::native);

}  // namespace
}  // namespace remat::cuda
