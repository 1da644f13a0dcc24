// rotary_embedding's CUDA kernels (cuda/rotary.h) registered for
// ops/rotary.h: the cos / sin table on the device (f32 [2, seq, half]), then
// the rows rotated reading x through its strides.
#include "cuda/op_util.h"
#include "cuda/rotary.h"
#include "ops/rotary.h"

namespace remat::cuda {
namespace {

Tensor rotate(const Tensor& x, double theta, std::int64_t position_offset, float sign) {
  const std::int64_t seq = x.size(-2), d = x.size(-1), half = d / 2;
  Tensor xd = x.detach();
  Tensor table = empty({2, seq, half}, TensorOptions(DType::f32, x.device()));
  float* cs = table.data<float>();
  float* sn = cs + seq * half;
  const StreamId stream = op_stream();
  rotary_table(cs, sn, seq, half, theta, position_offset, sign, stream);
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype(), x.device()));
  rotary(out.raw_data(), xd.raw_data(), layout_of("rotary_embedding", xd), x.dtype(), cs, sn, stream);
  return out;
}

const KernelRegistration<RotaryKernels> kCuda(rotary_kernels(), DeviceType::CUDA, {rotate}, KernelDTypes::native);

}  // namespace
}  // namespace remat::cuda
