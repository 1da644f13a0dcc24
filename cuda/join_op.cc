// cat's CUDA kernel registered for ops/join.h: each input copied into its
// narrowed view of the output (any layout), as raw elements.
#include "cuda/copy.h"
#include "cuda/op_util.h"
#include "ops/join.h"

namespace remat::cuda {
namespace {

Tensor cat(const std::vector<Tensor>& xs, std::int64_t d, const Shape& shape) {
  Tensor out = empty(shape, TensorOptions(xs[0].dtype(), xs[0].device()));
  if (out.numel() == 0) return out;
  std::int64_t off = 0;
  for (const auto& x : xs) {
    const std::int64_t len = x.size(d);
    if (len > 0) {
      const Tensor dst = out.narrow(d, off, len);
      copy_strided(dst.raw_data(), dst.dtype(), layout_of("cat", dst), x.raw_data(), x.dtype(), layout_of("cat", x),
                   op_stream());
    }
    off += len;
  }
  return out;
}

const KernelRegistration<CatKernels> kCuda(cat_kernels(), DeviceType::CUDA, {cat}, KernelDTypes::native);

}  // namespace
}  // namespace remat::cuda
