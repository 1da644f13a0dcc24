// The arithmetic ops' CUDA kernels (cuda/elementwise.h) registered for
// ops/binary.h: operands in their own dtype, read in place through their
// (broadcast) strides.
#include "cuda/elementwise.h"
#include "cuda/op_util.h"
#include "ops/binary.h"

namespace remat::cuda {
namespace {

BinaryOp code(BinaryFn f) {
  switch (f) {
    case BinaryFn::add: return BinaryOp::add;
    case BinaryFn::sub: return BinaryOp::sub;
    case BinaryFn::mul: return BinaryOp::mul;
    case BinaryFn::div: return BinaryOp::div;
  }
  return BinaryOp::add;
}

Tensor tensors(BinaryFn f, const Tensor& a, const Tensor& b) {
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), "arithmetic op");
  Tensor ea = a.detach().expand(shape), eb = b.detach().expand(shape);
  Tensor out = empty(shape, TensorOptions(a.dtype(), a.device()));
  binary(code(f), out.raw_data(), ea.raw_data(), layout_of("arithmetic op", ea), eb.raw_data(),
         layout_of("arithmetic op", eb), a.dtype(), op_stream());
  return out;
}

Tensor scalar(BinaryFn f, const Tensor& a, float s, bool scalar_first) {
  Tensor ad = a.detach();
  Tensor out = empty(a.sizes(), TensorOptions(a.dtype(), a.device()));
  binary_scalar(code(f), out.raw_data(), ad.raw_data(), layout_of("arithmetic op", ad), s, scalar_first, a.dtype(),
                op_stream());
  return out;
}

const KernelRegistration<BinaryKernels> kCuda(binary_kernels(), DeviceType::CUDA, {tensors, scalar},
                                              KernelDTypes::native);

}  // namespace
}  // namespace remat::cuda
