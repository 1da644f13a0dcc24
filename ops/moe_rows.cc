#include "ops/moe_rows.h"

#include <algorithm>

#include "cuda/moe_dispatch.h"
#include "engine/parallel_for.h"
#include "ops/kernel_util.h"

namespace remat {

using namespace ops_detail;

namespace {

void check_on_cuda(const char* op, const Tensor& t) {
  REMAT_CHECK(t.defined() && on_cuda(t), DeviceError, op, ": takes CUDA tensors, got ", describe(t));
}

void check_on_cpu(const char* op, const Tensor& t) {
  REMAT_CHECK(t.defined() && t.device().is_cpu(), DeviceError, op, ": takes CPU tensors, got ", describe(t));
}

// CPU: out[r] = x[src[r]] (w null) or w[r] * x[src[r]] (x, out contiguous f32 of width d).
void gather_rows(const float* x, const std::int64_t* src, const float* w, float* out, std::int64_t rows,
                 std::int64_t d) {
  parallel_rows(rows, d, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      if (!w) {
        std::copy_n(x + src[r] * d, d, out + r * d);
        continue;
      }
      for (std::int64_t c = 0; c < d; ++c) out[r * d + c] = w[r] * x[src[r] * d + c];
    }
  });
}

// CPU: out[dst[r]] += w[r] * y[r] for rows in order: parallel over column
// blocks, so every element adds its rows in the same order whatever the
// thread count.
void scatter_add_rows(const float* y, const float* w, const std::int64_t* dst, float* out, std::int64_t rows,
                      std::int64_t d) {
  constexpr std::int64_t kCols = 64;
  const std::int64_t blocks = (d + kCols - 1) / kCols;
  parallel_for(0, blocks, 1, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b) {
      const std::int64_t c0 = b * kCols, c1 = std::min(d, c0 + kCols);
      for (std::int64_t r = 0; r < rows; ++r) {
        const float wr = w ? w[r] : 1.0f;
        float* o = out + dst[r] * d;
        const float* yr = y + r * d;
        for (std::int64_t c = c0; c < c1; ++c) o[c] += wr * yr[c];
      }
    }
  });
}

}  // namespace

void moe_rows_check_device(const char* op, const Tensor& a, const Tensor* b) {
  check_kernel_device(op, a);
  if (b)
    REMAT_CHECK(a.device() == b->device(), DeviceError, op, ": ", describe(a), " and ", describe(*b),
                " are on different devices");
}

void moe_gather_rows_into(const Tensor& out, const Tensor& x, const Tensor& idx, const Tensor& w) {
  constexpr const char* op = "moe_gather_rows_into";
  if (on_cuda(out)) {
    if constexpr (kHaveCuda) {
      Tensor xc = contiguous_detached(x);
      Tensor wf = w.defined() ? f32_contiguous(w.detach()) : Tensor();
      cuda::moe_gather_rows(out.raw_data(), out.dtype(), xc.raw_data(), xc.dtype(), idx.data<std::int64_t>(),
                            wf.defined() ? wf.data<float>() : nullptr, out.size(0), xc.size(1), cuda_stream());
      return;
    } else {
      no_cuda_kernel(op);
    }
  }
  check_on_cpu(op, out);
  REMAT_CHECK(out.dtype() == DType::f32 && out.is_contiguous(), DTypeError, op,
              ": the CPU kernel writes a contiguous f32 tensor, got ", describe(out));
  Tensor xf = f32_contiguous(x.detach());
  Tensor wf = w.defined() ? f32_contiguous(w.detach()) : Tensor();
  gather_rows(xf.data<float>(), idx.data<std::int64_t>(), wf.defined() ? wf.data<float>() : nullptr,
              out.data<float>(), out.size(0), out.size(1));
}

Tensor moe_scatter_add_rows(const Tensor& y, const Tensor& w, const Tensor& token_of_row, std::int64_t tokens,
                            DType dtype) {
  check_on_cpu("moe_scatter_add_rows", y);
  const std::int64_t d = y.size(1);
  Tensor yf = f32_contiguous(y.detach());
  Tensor wf = w.defined() ? f32_contiguous(w.detach()) : Tensor();
  Tensor out = zeros({tokens, d});
  scatter_add_rows(yf.data<float>(), wf.defined() ? wf.data<float>() : nullptr, token_of_row.data<std::int64_t>(),
                   out.data<float>(), token_of_row.size(0), d);
  return from_f32(out, dtype);
}

Tensor moe_row_of_slot(const Tensor& slot_of_row, std::int64_t tokens, std::int64_t top_k, Device device) {
  constexpr const char* op = "moe_row_of_slot";
  REMAT_CHECK(device.is_cuda(), DeviceError, op, ": takes a CUDA device, got ", device);
  if constexpr (kHaveCuda) {
    Tensor slots = slot_of_row.to(device).contiguous();
    Tensor out = empty({tokens * top_k}, TensorOptions(DType::i64, device));
    cuda::moe_invert_rows(out.data<std::int64_t>(), tokens * top_k, slots.data<std::int64_t>(), slots.numel(),
                          cuda_stream());
    return out;
  } else {
    no_cuda_kernel(op);
  }
}

Tensor moe_sum_token_rows(const Tensor& y, const Tensor& w, const Tensor& row_of_slot, std::int64_t tokens,
                          std::int64_t top_k, DType dtype) {
  constexpr const char* op = "moe_sum_token_rows";
  check_on_cuda(op, y);
  if constexpr (kHaveCuda) {
    const std::int64_t d = y.size(1);
    Tensor yc = contiguous_detached(y);
    Tensor wf = w.defined() ? f32_contiguous(w.detach()) : Tensor();
    Tensor out = empty({tokens, d}, TensorOptions(dtype, y.device()));
    cuda::moe_combine_rows(out.raw_data(), dtype, yc.raw_data(), yc.dtype(), wf.defined() ? wf.data<float>() : nullptr,
                           row_of_slot.data<std::int64_t>(), tokens, top_k, d, cuda_stream());
    return out;
  } else {
    no_cuda_kernel(op);
  }
}

Tensor moe_row_dots(const Tensor& a, const Tensor& a_rows, const Tensor& b) {
  constexpr const char* op = "moe_row_dots";
  const std::int64_t r = a_rows.size(0), d = a.size(1);
  if (on_cuda(a)) {
    if constexpr (kHaveCuda) {
      Tensor ac = contiguous_detached(a), bc = contiguous_detached(b);
      Tensor out = empty({r}, TensorOptions(DType::f32, a.device()));
      cuda::moe_row_dots(out.data<float>(), ac.raw_data(), ac.dtype(), a_rows.data<std::int64_t>(), bc.raw_data(),
                         bc.dtype(), r, d, cuda_stream());
      return out;
    } else {
      no_cuda_kernel(op);
    }
  }
  check_on_cpu(op, a);
  Tensor af = f32_contiguous(a.detach()), bf = f32_contiguous(b.detach());
  const float* ap = af.data<float>();
  const float* bp = bf.data<float>();
  const std::int64_t* rows = a_rows.data<std::int64_t>();
  Tensor out = empty({r});
  float* p = out.data<float>();
  parallel_rows(r, d, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t k = r0; k < r1; ++k) p[k] = lane_dot(ap + rows[k] * d, bp + k * d, d);
  });
  return out;
}

std::vector<Tensor> moe_combine_grads(const Tensor& g, const Tensor& y, const Tensor& w, const Tensor& token_of_row,
                                      bool want_gy, bool want_gw, DType ydt, DType wdt) {
  const std::int64_t r = token_of_row.size(0), d = g.size(1);
  // One contiguous copy of g serves both gradients (f32 on the CPU, which
  // computes in f32; the CUDA kernels read 16-bit values themselves).
  Tensor gc = on_cuda(g) ? contiguous_detached(g) : f32_contiguous(g.detach());
  Tensor gy, gw;
  if (want_gy) {
    gy = empty({r, d}, TensorOptions(on_cuda(g) ? ydt : DType::f32, g.device()));
    moe_gather_rows_into(gy, gc, token_of_row, w);
    gy = from_f32(gy, ydt);
  }
  if (want_gw) gw = from_f32(moe_row_dots(gc, token_of_row, y), wdt);
  return {gy, gw};
}

}  // namespace remat
