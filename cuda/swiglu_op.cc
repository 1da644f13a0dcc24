// swiglu's CUDA kernels (cuda/swiglu.cu) registered for the op
// (ops/swiglu.h): operands in their own dtype, gate and up read through
// their strides.
#include "cuda/op_util.h"
#include "cuda/swiglu.h"
#include "ops/swiglu.h"

namespace remat::cuda {
namespace {

Tensor forward(const Tensor& gate, const Tensor& up) {
  Tensor g = gate.detach(), u = up.detach();
  Tensor out = empty(gate.sizes(), TensorOptions(gate.dtype(), gate.device()));
  swiglu_forward(out.raw_data(), g.raw_data(), layout_of("swiglu", g), u.raw_data(), layout_of("swiglu", u),
                 gate.dtype(), op_stream());
  return out;
}

// With dy_writable, dup lands in dy's buffer when d is that buffer (dy
// already dense in the compute dtype): each thread loads its elements of dy
// before it stores theirs.
std::vector<Tensor> backward(const Tensor& dy, const Tensor& gate, const Tensor& up, bool need_dgate,
                             bool need_dup, bool dy_writable) {
  REMAT_CHECK(dy.sizes() == gate.sizes() && dy.device() == gate.device(), ShapeError,
              "swiglu backward: gradient ", describe(dy), " does not match gate ", describe(gate));
  // Dense operands of one dtype: gate's, or f32 (the CPU's compute type) if
  // dy arrives in another; the gradients end in gate's dtype (the runner).
  const DType dt = dy.dtype() == gate.dtype() ? gate.dtype() : DType::f32;
  const TensorOptions opts(dt, gate.device());
  Tensor d = contiguous_detached(dy.detach().to(dt));
  Tensor g = contiguous_detached(gate.detach().to(dt));
  Tensor u = need_dgate ? contiguous_detached(up.detach().to(dt)) : Tensor();
  Tensor dgate = need_dgate ? empty(gate.sizes(), opts) : Tensor();
  const bool in_place = dy_writable && d.shares_storage_with(dy) && d.sizes() == gate.sizes();
  Tensor dup = need_dup ? (in_place ? d : empty(gate.sizes(), opts)) : Tensor();
  swiglu_backward(need_dgate ? dgate.raw_data() : nullptr, need_dup ? dup.raw_data() : nullptr, d.raw_data(),
                  g.raw_data(), need_dgate ? u.raw_data() : nullptr, gate.numel(), dt, op_stream());
  return {dgate, dup};
}

const KernelRegistration<SwigluKernels> kCuda(swiglu_kernels(), DeviceType::CUDA, {forward, backward},
                                              KernelDTypes::native);

}  // namespace
}  // namespace remat::cuda
