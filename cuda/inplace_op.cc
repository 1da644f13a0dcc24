// The in-place updates' CUDA kernel (cuda/elementwise.h) registered for
// ops/inplace.h.
#include "cuda/elementwise.h"
#include "cuda/op_util.h"
#include "ops/inplace.h"

namespace remat::cuda {
namespace {

void update_kernel(UpdateFn f, Tensor& x, const Tensor& y, float alpha) {
  const UpdateOp code = f == UpdateFn::add ? UpdateOp::add : f == UpdateFn::mul ? UpdateOp::mul : UpdateOp::scale;
  update(code, x.raw_data(), layout_of("in-place update", x), y.raw_data(), layout_of("in-place update", y), alpha,
         x.dtype(), op_stream());
}

const KernelRegistration<InplaceKernels> kCuda(inplace_kernels(), DeviceType::CUDA, {update_kernel},
                                               KernelDTypes::native);

}  // namespace
}  // namespace remat::cuda
