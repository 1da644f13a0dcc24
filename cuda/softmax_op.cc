// softmax's CUDA kernels (cuda/softmax.h) registered for ops/softmax.h:
// contiguous rows in the operands' dtype.
#include "cuda/op_util.h"
#include "cuda/softmax.h"
#include "ops/softmax.h"

namespace remat::cuda {
namespace {

// `t` in row layout, contiguous in `dtype`.
Tensor to_rows(const Tensor& t, const SoftmaxRows& l, DType dtype) {
  Tensor v = t.detach();
  if (v.dtype() != dtype) v = v.to(dtype);
  if (l.moved) v = v.permute(l.perm);
  return contiguous_detached(v);
}

Tensor from_rows(const Tensor& rows, const SoftmaxRows& l) {
  return l.moved ? rows.permute(l.inverse).contiguous() : rows;
}

Tensor forward(const Tensor& x, const SoftmaxRows& l, bool log) {
  Tensor xr = to_rows(x, l, x.dtype());
  Tensor out = empty(xr.sizes(), TensorOptions(x.dtype(), x.device()));
  softmax_forward(out.raw_data(), xr.raw_data(), x.dtype(), l.rows, l.n, log, op_stream());
  return from_rows(out, l);
}

Tensor backward(const Tensor& g, const Tensor& y, const SoftmaxRows& l, bool log, DType dtype) {
  Tensor gr = to_rows(g, l, dtype), yr = to_rows(y, l, dtype);
  Tensor dx = empty(gr.sizes(), TensorOptions(dtype, y.device()));
  softmax_backward(dx.raw_data(), gr.raw_data(), yr.raw_data(), dtype, l.rows, l.n, log, op_stream());
  return from_rows(dx, l);
}

const KernelRegistration<SoftmaxKernels> kCuda(softmax_kernels(), DeviceType::CUDA, {forward, backward},
                                               KernelDTypes::native);

}  // namespace
}  // namespace remat::cuda
