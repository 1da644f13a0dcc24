// The MXFP8 codec's CUDA kernels (cuda/mxfp8.h, one warp per block)
// registered for ops/mxfp8.h.
#include "cuda/mxfp8.h"
#include "cuda/op_util.h"
#include "ops/mxfp8.h"

namespace remat::cuda {
namespace {

Tensor quantize(const Tensor& src) {
  const std::int64_t n = src.numel();
  Tensor packed = empty({mxfp8_packed_numel(n)}, TensorOptions(DType::fp8_e4m3, src.device()));
  mxfp8_quantize(static_cast<std::uint8_t*>(packed.raw_data()), src.raw_data(), src.dtype(), n, op_stream());
  return packed;
}

Tensor dequantize(const Tensor& packed, const Shape& sizes, DType dtype) {
  Tensor out = empty(sizes, TensorOptions(dtype, packed.device()));
  mxfp8_dequantize(out.raw_data(), dtype, static_cast<const std::uint8_t*>(packed.raw_data()), shape_numel(sizes),
                   op_stream());
  return out;
}

const KernelRegistration<Mxfp8Kernels> kCuda(mxfp8_kernels(), DeviceType::CUDA, {quantize, dequantize},
                                             KernelDTypes::native);

}  // namespace
}  // namespace remat::cuda
