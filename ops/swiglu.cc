#include "ops/swiglu.h"

#include <Eigen/Core>

#include "cuda/swiglu.h"
#include "ops/kernel_util.h"

namespace remat {

using namespace ops_detail;

namespace {

using ArrayMap = Eigen::Map<Eigen::ArrayXf>;
using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf>;

// Elements per block. Blocks are fixed (not the thread chunks), so each
// element goes through the same (vector or scalar) exp path for any thread
// count, and the results do not depend on it.
constexpr std::int64_t kBlock = 4096;

// Runs fn(begin, end) over [0, n) in fixed blocks of kBlock elements.
template <typename Fn>
void parallel_blocks(std::int64_t n, Fn&& fn) {
  const std::int64_t blocks = (n + kBlock - 1) / kBlock;
  parallel_for(0, blocks, 4, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b) fn(b * kBlock, std::min(n, (b + 1) * kBlock));
  });
}

Tensor swiglu_forward(const Tensor& gate, const Tensor& up) {
  NoGradGuard ng;
  if constexpr (kHaveCuda) {
    if (on_cuda(gate)) {  // gate and up read in place through their strides
      Tensor g = gate.detach(), u = up.detach();
      Tensor out = empty(gate.sizes(), TensorOptions(gate.dtype(), gate.device()));
      cuda::swiglu_forward(out.raw_data(), g.raw_data(), layout_of("swiglu", g), u.raw_data(),
                           layout_of("swiglu", u), gate.dtype(), cuda_stream());
      return out;
    }
  }
  Tensor gf = f32_contiguous(gate), uf = f32_contiguous(up);
  Tensor out = empty(gate.sizes(), DType::f32);
  const float* pg = gf.data<float>();
  const float* pu = uf.data<float>();
  float* po = out.data<float>();
  parallel_blocks(out.numel(), [&](std::int64_t i0, std::int64_t i1) {
    const std::int64_t n = i1 - i0;
    ConstArrayMap g(pg + i0, n), u(pu + i0, n);
    ArrayMap o(po + i0, n);
    o = g / (1.0f + (-g).exp()) * u;
  });
  return from_f32(out, gate.dtype());
}

// With s = sigmoid(gate): dgate = dy * up * s * (1 + gate * (1 - s)), dup = dy * gate * s.
std::vector<Tensor> swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up,
                                    bool need_dgate, bool need_dup) {
  NoGradGuard ng;
  if constexpr (kHaveCuda) {
    if (on_cuda(gate)) {
      REMAT_CHECK(dy.sizes() == gate.sizes() && dy.device() == gate.device(), ShapeError,
                  "swiglu backward: gradient ", describe(dy), " does not match gate ",
                  describe(gate));
      // Dense operands of one dtype: gate's, or f32 (the CPU's compute type) if
      // dy arrives in another; the gradients end in gate's dtype.
      const DType dt = dy.dtype() == gate.dtype() ? gate.dtype() : DType::f32;
      const TensorOptions opts(dt, gate.device());
      Tensor d = contiguous_detached(dy.detach().to(dt));
      Tensor g = contiguous_detached(gate.detach().to(dt));
      Tensor u = need_dgate ? contiguous_detached(up.detach().to(dt)) : Tensor();
      Tensor dgate = need_dgate ? empty(gate.sizes(), opts) : Tensor();
      Tensor dup = need_dup ? empty(gate.sizes(), opts) : Tensor();
      cuda::swiglu_backward(need_dgate ? dgate.raw_data() : nullptr,
                            need_dup ? dup.raw_data() : nullptr, d.raw_data(), g.raw_data(),
                            need_dgate ? u.raw_data() : nullptr, gate.numel(), dt, cuda_stream());
      return {need_dgate ? dgate.to(gate.dtype()) : Tensor(),
              need_dup ? dup.to(gate.dtype()) : Tensor()};
    }
  }
  Tensor df = f32_contiguous(dy), gf = f32_contiguous(gate);
  Tensor uf = need_dgate ? f32_contiguous(up) : Tensor();
  Tensor dgate = need_dgate ? empty(gate.sizes(), DType::f32) : Tensor();
  Tensor dup = need_dup ? empty(gate.sizes(), DType::f32) : Tensor();
  const float* pd = df.data<float>();
  const float* pg = gf.data<float>();
  const float* pu = need_dgate ? uf.data<float>() : nullptr;
  float* pdg = need_dgate ? dgate.data<float>() : nullptr;
  float* pdu = need_dup ? dup.data<float>() : nullptr;
  parallel_blocks(gate.numel(), [&](std::int64_t i0, std::int64_t i1) {
    const std::int64_t n = i1 - i0;
    Eigen::ArrayXf s(n);  // aligned scratch: exp results do not depend on addresses
    s = 1.0f / (1.0f + (-ConstArrayMap(pg + i0, n)).exp());
    const float* d = pd + i0;
    const float* g = pg + i0;
    const float* sp = s.data();
    if (need_dgate) {
      const float* u = pu + i0;
      float* o = pdg + i0;
      for (std::int64_t i = 0; i < n; ++i)
        o[i] = ((d[i] * u[i]) * sp[i]) * (1.0f + g[i] * (1.0f - sp[i]));
    }
    if (need_dup) {
      float* o = pdu + i0;
      for (std::int64_t i = 0; i < n; ++i) o[i] = d[i] * (g[i] * sp[i]);
    }
  });
  return {need_dgate ? from_f32(dgate, gate.dtype()) : Tensor(),
          need_dup ? from_f32(dup, gate.dtype()) : Tensor()};
}

}  // namespace

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  check_floating("swiglu", gate, "gate");
  check_same("swiglu", gate, up);
  check_kernel_device("swiglu", gate);
  REMAT_CHECK(gate.sizes() == up.sizes(), ShapeError, "swiglu: gate ", describe(gate), " and up ",
              describe(up), " must have the same shape");
  return dispatch1("swiglu", {gate, up}, [&] {
    Tensor out = swiglu_forward(gate, up);
    if (auto node = autograd::make_node("swiglu", {&gate, &up})) {
      node->save(gate);
      node->save(node->needs_input_grad(0) ? up : Tensor());  // only dgate needs up
      node->backward_fn = [](Node& n, std::vector<Tensor>& g) {
        return swiglu_backward(g[0], n.saved(0), n.saved(1), n.needs_input_grad(0),
                               n.needs_input_grad(1));
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

}  // namespace remat
