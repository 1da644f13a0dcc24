// rotary_embedding: its definition and CPU kernel.
#include "ops/rotary.h"

#include <cmath>
#include <vector>

#include "ops/kernel_util.h"
#include "ops/op.h"

namespace remat {

using namespace ops_detail;

KernelTable<RotaryKernels>& rotary_kernels() {
  static KernelTable<RotaryKernels> t("rotary_embedding");
  return t;
}

namespace {

// ---------------------------------------------------------------------------
// CPU kernel (f32)

Tensor rotate_cpu(const Tensor& x, double theta, std::int64_t position_offset, float sign) {
  const std::int64_t seq = x.size(-2), d = x.size(-1), half = d / 2;
  if (skip_compute(x)) {
    Tensor xf = f32_contiguous(x);
    return empty(x.sizes(), DType::f32);
  }
  // cos / sin of pos * inv_freq_i, computed in double, per (s, i).
  std::vector<float> cs(std::size_t(seq * half)), sn(std::size_t(seq * half));
  for (std::int64_t i = 0; i < half; ++i) {
    const double inv_freq = std::pow(theta, -2.0 * double(i) / double(d));
    for (std::int64_t s = 0; s < seq; ++s) {
      const double angle = double(position_offset + s) * inv_freq;
      cs[std::size_t(s * half + i)] = float(std::cos(angle));
      sn[std::size_t(s * half + i)] = sign * float(std::sin(angle));
    }
  }
  Tensor xf = f32_contiguous(x);
  Tensor out = empty(x.sizes(), DType::f32);
  const float* px = xf.data<float>();
  float* po = out.data<float>();
  const std::int64_t rows = d == 0 ? 0 : x.numel() / d;
  parallel_rows(rows, d, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* c = cs.data() + (r % seq) * half;
      const float* s = sn.data() + (r % seq) * half;
      const float* x1 = px + r * d;
      const float* x2 = x1 + half;
      float* o1 = po + r * d;
      float* o2 = o1 + half;
      for (std::int64_t i = 0; i < half; ++i) {
        o1[i] = x1[i] * c[i] - x2[i] * s[i];
        o2[i] = x2[i] * c[i] + x1[i] * s[i];
      }
    }
  });
  return out;
}

const KernelRegistration<RotaryKernels> kCpu(rotary_kernels(), DeviceType::CPU, {rotate_cpu}, KernelDTypes::f32);

// ---------------------------------------------------------------------------
// The op

struct RotaryState {
  double theta = 10000.0;
  std::int64_t position_offset = 0;
};

void check(const OpDef& op, const std::vector<Tensor>& in, const RotaryState& s) {
  const Tensor& x = in[0];
  check_floating(op.name(), x, "input");
  REMAT_CHECK(x.dim() >= 2, ShapeError, op.name(), ": input must be [..., S, D], got ", describe(x));
  REMAT_CHECK(x.size(-1) % 2 == 0, ShapeError, op.name(), ": the last dim (head dim D) must be even, got ",
              describe(x));
  REMAT_CHECK(s.theta > 0.0 && std::isfinite(s.theta), Error, op.name(), ": theta must be positive and finite, got ",
              s.theta);
}

OpResults forward(const std::vector<Tensor>& in, RotaryState& s) {
  return {{rotary_kernels().run(in[0].device(), &RotaryKernels::rotate, in[0], s.theta, s.position_offset, 1.0f)}};
}

std::vector<Tensor> backward(const OpBackward<RotaryState>& b) {
  const RotaryState& s = b.state();
  return {rotary_kernels().run(b.grad().device(), &RotaryKernels::rotate, b.grad(), s.theta, s.position_offset,
                               -1.0f)};
}

OpCost cost(const std::vector<Tensor>& in, const RotaryState&) {
  const double n = double(in[0].numel());
  return {0, 3 * n, 2 * n * double(element_size(in[0].dtype()))};
}

const Op<RotaryState> kRotary({.name = "rotary_embedding", .inputs = {"x"}, .outputs = {{"y"}},
                               .summary = "rotary position embedding over the last two dims [S, D]"},
                              {.check = check, .forward = forward, .backward = backward, .cost = cost},
                              &rotary_kernels());

}  // namespace

Tensor rotary_embedding(const Tensor& x, double theta, std::int64_t position_offset) {
  return kRotary.call1({x}, {theta, position_offset});
}

}  // namespace remat
