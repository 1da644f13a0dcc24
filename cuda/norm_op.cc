// The normalisations' CUDA kernels (cuda/norm.h) registered for ops/norm.h:
// contiguous operands in x's dtype, statistics in f32. add_rms_norm is not
// fused on CUDA yet: add's kernel, then rms_norm's (the bits of the two ops).
#include "cuda/elementwise.h"
#include "cuda/norm.h"
#include "cuda/op_util.h"
#include "ops/norm.h"

namespace remat::cuda {
namespace {

// `t` detached and contiguous in `dtype` (undefined stays undefined).
Tensor operand(const Tensor& t, DType dtype) {
  if (!t.defined()) return t;
  return contiguous_detached(t.dtype() == dtype ? t : t.detach().to(dtype));
}

const void* ptr_or_null(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }

// An f32 workspace of n floats on `device` (undefined for n == 0).
Tensor workspace(std::int64_t n, Device device) {
  return n > 0 ? empty({n}, TensorOptions(DType::f32, device)) : Tensor();
}

std::int64_t rows_of(const Tensor& x) { return x.size(-1) == 0 ? 0 : x.numel() / x.size(-1); }

std::vector<Tensor> rms_forward(const Tensor& x, const Tensor& w, float eps) {
  const std::int64_t d = x.size(-1), rows = rows_of(x);
  Tensor xc = operand(x, x.dtype()), wc = operand(w, x.dtype());
  Tensor y = empty(x.sizes(), TensorOptions(x.dtype(), x.device()));
  Tensor rstd = empty({rows}, TensorOptions(DType::f32, x.device()));
  rms_norm_forward(y.raw_data(), rstd.data<float>(), xc.raw_data(), wc.raw_data(), x.dtype(), rows, d, eps,
                   op_stream());
  return {y, rstd};
}

std::vector<Tensor> rms_backward(const Tensor& g, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                 bool need_dx, bool need_dw) {
  const std::int64_t d = x.size(-1), rows = rows_of(x);
  const DType dt = x.dtype();
  const TensorOptions opts(dt, x.device());
  Tensor gc = operand(g, dt), xc = operand(x, dt);
  Tensor wc = need_dx ? operand(w, dt) : Tensor();
  Tensor rc = operand(rstd, DType::f32);
  Tensor dx = need_dx ? empty(x.sizes(), opts) : Tensor();
  Tensor dw = need_dw ? empty({d}, opts) : Tensor();
  Tensor work = workspace(need_dw ? norm_param_grad_workspace(rows, d) : 0, x.device());
  rms_norm_backward(need_dx ? dx.raw_data() : nullptr, need_dw ? dw.raw_data() : nullptr, gc.raw_data(),
                    xc.raw_data(), ptr_or_null(wc), rc.data<float>(), dt, rows, d,
                    work.defined() ? work.data<float>() : nullptr, op_stream());
  return {dx, dw};
}

std::vector<Tensor> ln_forward(const Tensor& x, const Tensor& w, const Tensor& b, float eps) {
  const std::int64_t d = x.size(-1), rows = rows_of(x);
  const DType dt = x.dtype();
  Tensor xc = operand(x, dt), wc = operand(w, dt), bc = operand(b, dt);
  Tensor y = empty(x.sizes(), TensorOptions(dt, x.device()));
  Tensor mean = empty({rows}, TensorOptions(DType::f32, x.device()));
  Tensor rstd = empty({rows}, TensorOptions(DType::f32, x.device()));
  layer_norm_forward(y.raw_data(), mean.data<float>(), rstd.data<float>(), xc.raw_data(), ptr_or_null(wc),
                     ptr_or_null(bc), dt, rows, d, eps, op_stream());
  return {y, mean, rstd};
}

std::vector<Tensor> ln_backward(const Tensor& g, const Tensor& x, const Tensor& w, const Tensor& mean,
                                const Tensor& rstd, DType dtype, bool need_dx, bool need_dw, bool need_db) {
  const std::int64_t d = g.size(-1), rows = rows_of(g);
  const bool need_x = need_dx || need_dw;
  const TensorOptions opts(dtype, g.device());
  Tensor gc = operand(g, dtype);
  Tensor xc = need_x ? operand(x, dtype) : Tensor();
  Tensor wc = need_dx ? operand(w, dtype) : Tensor();
  Tensor mc = need_x ? operand(mean, DType::f32) : Tensor();
  Tensor rc = need_x ? operand(rstd, DType::f32) : Tensor();
  Tensor dx = need_dx ? empty(g.sizes(), opts) : Tensor();
  Tensor dw = need_dw ? empty({d}, opts) : Tensor();
  Tensor db = need_db ? empty({d}, opts) : Tensor();
  const std::int64_t per = norm_param_grad_workspace(rows, d);
  Tensor work = workspace(per * ((need_dw ? 1 : 0) + (need_db ? 1 : 0)), g.device());
  layer_norm_backward(need_dx ? dx.raw_data() : nullptr, need_dw ? dw.raw_data() : nullptr,
                      need_db ? db.raw_data() : nullptr, gc.raw_data(), ptr_or_null(xc), ptr_or_null(wc),
                      need_x ? mc.data<float>() : nullptr, need_x ? rc.data<float>() : nullptr, dtype, rows, d,
                      work.defined() ? work.data<float>() : nullptr, op_stream());
  return {dx, dw, db};
}

std::vector<Tensor> add_rms_forward(const Tensor& x, const Tensor& res, const Tensor& w, float eps) {
  // add's kernel (operands read through their strides), then rms_norm's.
  Tensor xd = x.detach(), rd = res.detach();
  Tensor h = empty(x.sizes(), TensorOptions(x.dtype(), x.device()));
  binary(BinaryOp::add, h.raw_data(), xd.raw_data(), layout_of("add_rms_norm", xd), rd.raw_data(),
         layout_of("add_rms_norm", rd), x.dtype(), op_stream());
  std::vector<Tensor> f = rms_forward(h, w, eps);
  return {h, f[0], f[1]};
}

std::vector<Tensor> add_rms_backward(const Tensor& gh, const Tensor& gy, const Tensor& h, const Tensor& w,
                                     const Tensor& rstd, bool need_dh, bool need_dw) {
  // rms_norm's backward kernel, then add's kernel for grad_h + dn.
  std::vector<Tensor> g = rms_backward(gy, h, w, rstd, need_dh, need_dw);
  Tensor dh;
  if (need_dh) {
    Tensor a = operand(gh, h.dtype());
    dh = empty(h.sizes(), TensorOptions(h.dtype(), h.device()));
    binary(BinaryOp::add, dh.raw_data(), a.raw_data(), layout_of("add_rms_norm", a), g[0].raw_data(),
           layout_of("add_rms_norm", g[0]), h.dtype(), op_stream());
  }
  return {dh, g[1]};
}

const KernelRegistration<NormKernels> kCuda(norm_kernels(), DeviceType::CUDA,
                                            {rms_forward, rms_backward, ln_forward, ln_backward},
                                            KernelDTypes::native);
const KernelRegistration<AddRmsNormKernels> kCudaAdd(add_rms_norm_kernels(), DeviceType::CUDA,
                                                     {add_rms_forward, add_rms_backward}, KernelDTypes::native);

}  // namespace
}  // namespace remat::cuda
