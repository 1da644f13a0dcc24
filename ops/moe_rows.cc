// The MoE row movement's CPU kernels and the combine's gradients.
#include "ops/moe_rows.h"

#include <algorithm>

#include "engine/parallel_for.h"
#include "ops/kernel_util.h"

namespace remat {

using namespace ops_detail;

KernelTable<MoeRowsKernels>& moe_rows_kernels() {
  static KernelTable<MoeRowsKernels> t("moe row movement");
  return t;
}

std::vector<Tensor> moe_combine_grads(const Tensor& g, const Tensor& y, const Tensor& w, const Tensor& token_of_row,
                                      bool want_gy, bool want_gw, DType ydt, DType wdt) {
  const KernelTable<MoeRowsKernels>& k = moe_rows_kernels();
  const Device dev = g.device();
  const std::int64_t r = token_of_row.size(0), d = g.size(1);
  // One contiguous copy of g serves both gradients.
  Tensor gc = contiguous_detached(k.stage(dev, g.detach()));
  Tensor gy, gw;
  if (want_gy) {
    gy = empty({r, d}, TensorOptions(k.compute_dtype(dev, ydt), dev));
    k.run(dev, &MoeRowsKernels::gather_rows, gy, gc, token_of_row, w);
    gy = from_f32(gy, ydt);
  }
  if (want_gw) gw = from_f32(k.run(dev, &MoeRowsKernels::row_dots, gc, token_of_row, y), wdt);
  return {gy, gw};
}

namespace {

// ---------------------------------------------------------------------------
// CPU kernels (f32)

void gather_cpu(Tensor& out, const Tensor& x, const Tensor& idx, const Tensor& w) {
  REMAT_CHECK(out.dtype() == DType::f32 && out.is_contiguous(), DTypeError,
              "moe gather_rows: the CPU kernel writes a contiguous f32 tensor, got ", describe(out));
  Tensor xf = f32_contiguous(x.detach());
  Tensor wf = w.defined() ? f32_contiguous(w.detach()) : Tensor();
  if (skip_compute(out)) return;
  const float* px = xf.data<float>();
  const std::int64_t* src = idx.data<std::int64_t>();
  const float* pw = wf.defined() ? wf.data<float>() : nullptr;
  float* po = out.data<float>();
  const std::int64_t rows = out.size(0), d = out.size(1);
  parallel_rows(rows, d, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      if (!pw) {
        std::copy_n(px + src[r] * d, d, po + r * d);
        continue;
      }
      for (std::int64_t c = 0; c < d; ++c) po[r * d + c] = pw[r] * px[src[r] * d + c];
    }
  });
}

// The CPU sums by token_of_row.
Tensor routing_index_cpu(const Tensor& token_of_row, const Tensor&, Device device) {
  return token_of_row.to(device).contiguous();
}

// out[token_of_row[r]] += w[r] * y[r] for rows in order: parallel over column
// blocks, so every element adds its rows in the same order whatever the
// thread count.
Tensor sum_rows_cpu(const Tensor& y, const Tensor& w, const Tensor& token_of_row, std::int64_t tokens,
                    std::int64_t, DType) {
  const std::int64_t d = y.size(1), rows = token_of_row.size(0);
  Tensor yf = f32_contiguous(y.detach());
  Tensor wf = w.defined() ? f32_contiguous(w.detach()) : Tensor();
  Tensor out = zeros({tokens, d});
  if (skip_compute(out)) return out;
  const float* py = yf.data<float>();
  const float* pw = wf.defined() ? wf.data<float>() : nullptr;
  const std::int64_t* dst = token_of_row.data<std::int64_t>();
  float* po = out.data<float>();
  constexpr std::int64_t kCols = 64;
  const std::int64_t blocks = (d + kCols - 1) / kCols;
  parallel_for(0, blocks, 1, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b) {
      const std::int64_t c0 = b * kCols, c1 = std::min(d, c0 + kCols);
      for (std::int64_t r = 0; r < rows; ++r) {
        const float wr = pw ? pw[r] : 1.0f;
        float* o = po + dst[r] * d;
        const float* yr = py + r * d;
        for (std::int64_t c = c0; c < c1; ++c) o[c] += wr * yr[c];
      }
    }
  });
  return out;
}

Tensor row_dots_cpu(const Tensor& a, const Tensor& a_rows, const Tensor& b) {
  const std::int64_t r = a_rows.size(0), d = a.size(1);
  Tensor af = f32_contiguous(a.detach()), bf = f32_contiguous(b.detach());
  Tensor out = empty({r});
  if (skip_compute(out)) return out;
  const float* ap = af.data<float>();
  const float* bp = bf.data<float>();
  const std::int64_t* rows = a_rows.data<std::int64_t>();
  float* p = out.data<float>();
  parallel_rows(r, d, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t k = r0; k < r1; ++k) p[k] = lane_dot(ap + rows[k] * d, bp + k * d, d);
  });
  return out;
}

const KernelRegistration<MoeRowsKernels> kCpu(moe_rows_kernels(), DeviceType::CPU,
                                              {gather_cpu, routing_index_cpu, sum_rows_cpu, row_dots_cpu},
                                              KernelDTypes::f32);

}  // namespace
}  // namespace remat
