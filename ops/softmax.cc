// softmax and log_softmax: their definitions and CPU kernels.
#include "ops/softmax.h"

#include <Eigen/Core>
#include <cmath>

#include "ops/kernel_util.h"
#include "ops/op.h"

namespace remat {

using namespace ops_detail;

KernelTable<SoftmaxKernels>& softmax_kernels() {
  static KernelTable<SoftmaxKernels> t("softmax");
  return t;
}

SoftmaxRows softmax_rows(const Tensor& x, std::int64_t dim, const char* op) {
  SoftmaxRows l;
  const std::int64_t nd = x.dim();
  l.dim = wrap_dim(dim, nd, op);
  l.n = nd == 0 ? 1 : x.size(l.dim);
  l.rows = l.n == 0 ? 0 : x.numel() / l.n;
  l.moved = nd > 0 && l.dim != nd - 1;
  if (l.moved) {
    for (std::int64_t d = 0; d < nd; ++d)
      if (d != l.dim) l.perm.push_back(d);
    l.perm.push_back(l.dim);
    l.inverse.resize(std::size_t(nd));
    for (std::int64_t i = 0; i < nd; ++i) l.inverse[std::size_t(l.perm[std::size_t(i)])] = i;
  }
  return l;
}

namespace {

using ArrayMap = Eigen::Map<Eigen::ArrayXf>;
using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf>;

// ---------------------------------------------------------------------------
// CPU kernels (f32)

// `t` in row layout (contiguous f32).
Tensor to_rows(const Tensor& t, const SoftmaxRows& l) {
  Tensor v = t.detach();
  if (l.moved) v = v.permute(l.perm);
  return f32_contiguous(v);
}

// A row-layout result back in the original layout.
Tensor from_rows(const Tensor& rows, const SoftmaxRows& l) {
  return l.moved ? rows.permute(l.inverse).contiguous() : rows;
}

Tensor forward_cpu(const Tensor& x, const SoftmaxRows& l, bool log) {
  Tensor xr = to_rows(x, l);
  Tensor out = empty(xr.sizes(), DType::f32);
  if (skip_compute(out)) return from_rows(out, l);
  const float* px = xr.data<float>();
  float* po = out.data<float>();
  const std::int64_t n = l.n;
  parallel_rows(l.rows, n, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      ConstArrayMap in(px + r * n, n);
      ArrayMap o(po + r * n, n);
      const float m = in.maxCoeff();
      o = (in - m).exp();
      const float s = lane_sum(o.data(), n);
      if (log) {
        const float ls = std::log(s);
        o = (in - m) - ls;
      } else {
        o *= 1.0f / s;
      }
    }
  });
  return from_rows(out, l);
}

Tensor backward_cpu(const Tensor& g, const Tensor& y, const SoftmaxRows& l, bool log, DType) {
  Tensor gr = to_rows(g, l), yr = to_rows(y, l);
  Tensor dx = empty(gr.sizes(), DType::f32);
  if (skip_compute(dx)) return from_rows(dx, l);
  const float* pg = gr.data<float>();
  const float* py = yr.data<float>();
  float* pd = dx.data<float>();
  const std::int64_t n = l.n;
  parallel_rows(l.rows, n, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* gg = pg + r * n;
      const float* yy = py + r * n;
      float* d = pd + r * n;
      if (log) {
        const float s = lane_sum(gg, n);
        ArrayMap o(d, n);
        o = ConstArrayMap(yy, n).exp();
        for (std::int64_t i = 0; i < n; ++i) d[i] = gg[i] - d[i] * s;
      } else {
        const float s = lane_dot(gg, yy, n);
        for (std::int64_t i = 0; i < n; ++i) d[i] = yy[i] * (gg[i] - s);
      }
    }
  });
  return from_rows(dx, l);
}

const KernelRegistration<SoftmaxKernels> kCpu(softmax_kernels(), DeviceType::CPU, {forward_cpu, backward_cpu},
                                              KernelDTypes::f32);

// ---------------------------------------------------------------------------
// The ops

struct SoftmaxState {
  std::int64_t dim = -1;
  bool log = false;
};

void check(const OpDef& op, const std::vector<Tensor>& in, const SoftmaxState& s) {
  check_floating(op.name(), in[0], "input");
  softmax_rows(in[0], s.dim, op.name());
}

OpResults forward(const std::vector<Tensor>& in, SoftmaxState& s) {
  const SoftmaxRows l = softmax_rows(in[0], s.dim, "softmax");
  return {{softmax_kernels().run(in[0].device(), &SoftmaxKernels::forward, in[0], l, s.log)}};
}

std::vector<Tensor> backward(const OpBackward<SoftmaxState>& b) {
  const Tensor& y = b.saved("y");
  const SoftmaxRows l = softmax_rows(y, b.state().dim, "softmax");
  return {softmax_kernels().run(b.grad().device(), &SoftmaxKernels::backward, b.grad(), y, l, b.state().log,
                                b.input(0).dtype)};
}

OpCost cost(const std::vector<Tensor>& in, const SoftmaxState&) {
  const double n = double(in[0].numel());
  return {0, 4 * n, 2 * n * double(element_size(in[0].dtype()))};
}

Op<SoftmaxState> define(const char* name, const char* summary) {
  return Op<SoftmaxState>({.name = name, .inputs = {"x"}, .outputs = {{"y"}},
                           .saves = {{"y", SaveFrom::output, 0}}, .summary = summary},
                          {.check = check, .forward = forward, .backward = backward, .cost = cost},
                          &softmax_kernels());
}

const Op<SoftmaxState> kSoftmax = define("softmax", "exp(x - max) / sum(exp(x - max)) over a dim");
const Op<SoftmaxState> kLogSoftmax = define("log_softmax", "x - max - log(sum(exp(x - max))) over a dim");

}  // namespace

Tensor softmax(const Tensor& x, std::int64_t dim) { return kSoftmax.call1({x}, {dim, false}); }
Tensor log_softmax(const Tensor& x, std::int64_t dim) { return kLogSoftmax.call1({x}, {dim, true}); }

}  // namespace remat
