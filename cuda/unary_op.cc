// The unary ops' CUDA kernels (cuda/elementwise.h) registered for
// ops/unary.h: operands in their own dtype, x read through its strides.
#include "cuda/elementwise.h"
#include "cuda/op_util.h"
#include "ops/unary.h"

namespace remat::cuda {
namespace {

UnaryOp code(UnaryFn f) {
  switch (f) {
    case UnaryFn::neg: return UnaryOp::neg;
    case UnaryFn::exp: return UnaryOp::exp;
    case UnaryFn::log: return UnaryOp::log;
    case UnaryFn::sqrt: return UnaryOp::sqrt;
    case UnaryFn::rsqrt: return UnaryOp::rsqrt;
    case UnaryFn::pow: return UnaryOp::pow;
    case UnaryFn::abs: return UnaryOp::abs;
    case UnaryFn::relu: return UnaryOp::relu;
    case UnaryFn::gelu: return UnaryOp::gelu;
    case UnaryFn::silu: return UnaryOp::silu;
    case UnaryFn::sigmoid: return UnaryOp::sigmoid;
    case UnaryFn::tanh: return UnaryOp::tanh;
  }
  return UnaryOp::neg;
}

Tensor forward(UnaryFn f, const Tensor& x, float param) {
  Tensor xd = x.detach();
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype(), x.device()));
  unary(code(f), out.raw_data(), xd.raw_data(), layout_of("unary op", xd), x.dtype(), param, op_stream());
  return out;
}

Tensor backward(UnaryFn f, const Tensor& g, const Tensor& saved, float param) {
  REMAT_CHECK(g.device() == saved.device(), DeviceError, "unary op backward: gradient ", describe(g),
              " and saved tensor ", describe(saved), " are on different devices");
  REMAT_CHECK(g.sizes() == saved.sizes(), ShapeError, "unary op backward: gradient ", describe(g),
              " and saved tensor ", describe(saved), " have different shapes");
  // Mixed dtypes: both in f32 (as the CPU computes); the runner rounds the
  // gradient to the input's dtype.
  const DType dt = g.dtype() == saved.dtype() ? g.dtype() : DType::f32;
  Tensor gd = g.detach().to(dt), sd = saved.detach().to(dt);
  Tensor out = empty(g.sizes(), TensorOptions(dt, g.device()));
  unary_backward(code(f), out.raw_data(), gd.raw_data(), layout_of("unary op backward", gd), sd.raw_data(),
                 layout_of("unary op backward", sd), dt, param, op_stream());
  return out;
}

const KernelRegistration<UnaryKernels> kCuda(unary_kernels(), DeviceType::CUDA, {forward, backward},
                                             KernelDTypes::native);

}  // namespace
}  // namespace remat::cuda
