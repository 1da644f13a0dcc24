// swiglu: the op's definition and its CPU kernels.
#include "ops/swiglu.h"

#include <Eigen/Core>

#include "ops/kernel_util.h"
#include "ops/op.h"

namespace remat {

using namespace ops_detail;

KernelTable<SwigluKernels>& swiglu_kernels() {
  static KernelTable<SwigluKernels> t("swiglu");
  return t;
}

namespace {

using ArrayMap = Eigen::Map<Eigen::ArrayXf>;
using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf>;

// ---------------------------------------------------------------------------
// The op

void check(const OpDef& op, const std::vector<Tensor>& in, const NoState&) {
  const Tensor &gate = in[0], &up = in[1];
  check_floating(op.name(), gate, "gate");
  check_same(op.name(), gate, up);
  REMAT_CHECK(gate.sizes() == up.sizes(), ShapeError, op.name(), ": gate ", describe(gate), " and up ",
              describe(up), " must have the same shape");
}

OpResults forward(const std::vector<Tensor>& in, NoState&) {
  return {{swiglu_kernels().run(in[0].device(), &SwigluKernels::forward, in[0], in[1])}};
}

std::vector<Tensor> backward(const OpBackward<NoState>& b) {
  return swiglu_kernels().run(b.grad().device(), &SwigluKernels::backward, b.grad(), b.saved("gate"),
                              b.saved("up"), b.needs(0), b.needs(1), b.grad_writable());
}

// Per element: exp, add, divide, two multiplies.
OpCost cost(const std::vector<Tensor>& in, const NoState&) {
  const double n = double(in[0].numel());
  return {0, 5 * n, 3 * n * double(element_size(in[0].dtype()))};
}

const Op<> kSwiglu({.name = "swiglu",
                    .inputs = {"gate", "up"},
                    .outputs = {{"out"}},
                    .saves = {{"gate", SaveFrom::input, 0},
                              {"up", SaveFrom::input, 1, inputs_mask({0})}},  // only dgate needs up
                    .summary = "silu(gate) * up, fused"},
                   {.check = check, .forward = forward, .backward = backward, .cost = cost}, &swiglu_kernels());

// ---------------------------------------------------------------------------
// CPU kernels (f32)

// Elements go in fixed blocks (parallel_elementwise), so each one takes the
// same (vector or scalar) exp path for any thread count.
Tensor forward_cpu(const Tensor& gate, const Tensor& up) {
  Tensor gf = f32_contiguous(gate), uf = f32_contiguous(up);
  Tensor out = empty(gate.sizes(), DType::f32);
  if (skip_compute(out)) return out;
  const float* pg = gf.data<float>();
  const float* pu = uf.data<float>();
  float* po = out.data<float>();
  parallel_elementwise(out.numel(), [&](std::int64_t i0, std::int64_t i1) {
    const std::int64_t n = i1 - i0;
    ConstArrayMap g(pg + i0, n), u(pu + i0, n);
    ArrayMap o(po + i0, n);
    o = g / (1.0f + (-g).exp()) * u;
  });
  return out;
}

// With dy_writable and dy already f32 and dense, dup lands in dy's buffer:
// each block reads its dy elements for dgate before it overwrites them.
std::vector<Tensor> backward_cpu(const Tensor& dy, const Tensor& gate, const Tensor& up, bool need_dgate,
                                 bool need_dup, bool dy_writable) {
  Tensor df = f32_contiguous(dy), gf = f32_contiguous(gate);
  Tensor uf = need_dgate ? f32_contiguous(up) : Tensor();
  Tensor dgate = need_dgate ? empty(gate.sizes(), DType::f32) : Tensor();
  const bool in_place = dy_writable && df.shares_storage_with(dy) && df.is_contiguous();
  Tensor dup = need_dup ? (in_place ? df : empty(gate.sizes(), DType::f32)) : Tensor();
  if (skip_compute(df)) return {dgate, dup};
  const float* pd = df.data<float>();
  const float* pg = gf.data<float>();
  const float* pu = need_dgate ? uf.data<float>() : nullptr;
  float* pdg = need_dgate ? dgate.data<float>() : nullptr;
  float* pdu = need_dup ? dup.data<float>() : nullptr;
  parallel_elementwise(gate.numel(), [&](std::int64_t i0, std::int64_t i1) {
    const std::int64_t n = i1 - i0;
    Eigen::ArrayXf s(n);  // aligned scratch: exp results do not depend on addresses
    s = 1.0f / (1.0f + (-ConstArrayMap(pg + i0, n)).exp());
    const float* d = pd + i0;
    const float* g = pg + i0;
    const float* sp = s.data();
    if (need_dgate) {
      const float* u = pu + i0;
      float* o = pdg + i0;
      for (std::int64_t i = 0; i < n; ++i) o[i] = ((d[i] * u[i]) * sp[i]) * (1.0f + g[i] * (1.0f - sp[i]));
    }
    if (need_dup) {
      float* o = pdu + i0;
      for (std::int64_t i = 0; i < n; ++i) o[i] = d[i] * (g[i] * sp[i]);
    }
  });
  return {dgate, dup};
}

const KernelRegistration<SwigluKernels> kCpu(swiglu_kernels(), DeviceType::CPU, {forward_cpu, backward_cpu},
                                             KernelDTypes::f32);

}  // namespace

Tensor swiglu(const Tensor& gate, const Tensor& up) { return kSwiglu.call1({gate, up}); }

}  // namespace remat
