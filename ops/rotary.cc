#include "ops/rotary.h"

#include <cmath>
#include <vector>

#include "cuda/rotary.h"
#include "ops/kernel_util.h"

namespace remat {

using namespace ops_detail;

namespace {

// Rotates every row of x [..., S, D] by its position's angles; sign -1 rotates
// backwards (the inverse, used for the gradient).
Tensor rotary_kernel(const Tensor& x, double theta, std::int64_t position_offset, float sign) {
  NoGradGuard ng;
  const std::int64_t seq = x.size(-2), d = x.size(-1), half = d / 2;
  if constexpr (kHaveCuda) {
    if (on_cuda(x)) {
      // The cos / sin table on the device (f32 [2, seq, half]), then the rows
      // rotated reading x through its strides.
      Tensor xd = x.detach();
      Tensor table = empty({2, seq, half}, TensorOptions(DType::f32, x.device()));
      float* cs = table.data<float>();
      float* sn = cs + seq * half;
      const StreamId stream = cuda_stream();
      cuda::rotary_table(cs, sn, seq, half, theta, position_offset, sign, stream);
      Tensor out = empty(x.sizes(), TensorOptions(x.dtype(), x.device()));
      cuda::rotary(out.raw_data(), xd.raw_data(), layout_of("rotary_embedding", xd), x.dtype(), cs,
                   sn, stream);
      return out;
    }
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
  return from_f32(out, x.dtype());
}

}  // namespace

Tensor rotary_embedding(const Tensor& x, double theta, std::int64_t position_offset) {
  check_floating("rotary_embedding", x, "input");
  check_kernel_device("rotary_embedding", x);
  REMAT_CHECK(x.dim() >= 2, ShapeError, "rotary_embedding: input must be [..., S, D], got ",
              describe(x));
  REMAT_CHECK(x.size(-1) % 2 == 0, ShapeError,
              "rotary_embedding: the last dim (head dim D) must be even, got ", describe(x));
  REMAT_CHECK(theta > 0.0 && std::isfinite(theta), Error,
              "rotary_embedding: theta must be positive and finite, got ", theta);
  return dispatch1("rotary_embedding", {x}, [&] {
    Tensor out = rotary_kernel(x, theta, position_offset, 1.0f);
    if (auto node = autograd::make_node("rotary_embedding", {&x})) {
      node->backward_fn = [theta, position_offset](Node&, std::vector<Tensor>& g) {
        return std::vector<Tensor>{rotary_kernel(g[0], theta, position_offset, -1.0f)};
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

}  // namespace remat
