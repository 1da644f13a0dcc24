// Top-k: one warp per row. Round j finds, over the row, the best element that
// ranks strictly after round j-1's pick (the order is a strict total order,
// so those are exactly the elements not yet picked): each lane scans a strided
// share of the row, then a butterfly of shuffles leaves the warp's best in
// every lane. O(k * n / 32) per row: made for router rows (n up to a few
// hundred, k <= 8) but correct for any k <= n. No shared state between rows,
// so the result does not depend on the launch.
#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/kernel_util.cuh"
#include "cuda/topk.h"
#include "engine/meta_mirror.h"

namespace remat::cuda {

namespace {

using detail::from_f32;
using detail::load_f32;
using detail::offset_of;

constexpr int kThreads = 256;  // 8 rows per block

// ops/topk.cc's ranks_before: true if a (at index ia) ranks before b (at ib).
__device__ __forceinline__ bool ranks_before(float a, long long ia, float b, long long ib, bool largest) {
  const bool na = isnan(a), nb = isnan(b);
  if (na || nb) {
    if (na && nb) return ia < ib;
    return largest ? na : nb;
  }
  if (a != b) return largest ? a > b : a < b;
  return ia < ib;
}

template <typename T>
__global__ void topk_kernel(const T* __restrict__ x, Strided x_rows, std::int64_t x_stride, std::int64_t n,
                            T* __restrict__ values, std::int64_t* __restrict__ indices, Strided out_rows,
                            std::int64_t out_stride, std::int64_t rows, std::int64_t k, bool largest) {
  const int lane = int(threadIdx.x & 31);
  const std::int64_t warps = (std::int64_t(gridDim.x) * blockDim.x) >> 5;
  // Every lane of a warp has the same r: the loop is warp-uniform.
  for (std::int64_t r = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; r < rows; r += warps) {
    const T* row = x + offset_of(x_rows, r);
    const std::int64_t o = offset_of(out_rows, r);
    float pv = 0.0f;     // the previous pick's value
    long long pi = -1;   // and index (-1: none yet)
    for (std::int64_t j = 0; j < k; ++j) {
      float bv = 0.0f;
      long long bi = -1;
      for (long long i = lane; i < n; i += 32) {
        const float v = load_f32(row + i * x_stride);
        if (pi >= 0 && !ranks_before(pv, pi, v, i, largest)) continue;  // already picked
        if (bi < 0 || ranks_before(v, i, bv, bi, largest)) {
          bv = v;
          bi = i;
        }
      }
      for (int s = 16; s > 0; s >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, s);
        const long long oi = __shfl_xor_sync(0xffffffffu, bi, s);
        if (oi >= 0 && (bi < 0 || ranks_before(ov, oi, bv, bi, largest))) {
          bv = ov;
          bi = oi;
        }
      }
      pv = bv;
      pi = bi;  // k <= n leaves a candidate in every round, so bi >= 0
      if (lane == 0) {
        values[o + j * out_stride] = row[bi * x_stride];
        indices[o + j * out_stride] = bi;
      }
    }
  }
}

template <typename T>
__global__ void topk_backward_kernel(T* __restrict__ gx, Strided gx_rows, std::int64_t gx_stride,
                                     const T* __restrict__ g, Strided g_rows, std::int64_t g_stride,
                                     const std::int64_t* __restrict__ idx, Strided idx_rows,
                                     std::int64_t idx_stride, std::int64_t k, std::int64_t total) {
  for (std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t r = e / k, j = e - r * k;
    const std::int64_t i = idx[offset_of(idx_rows, r) + j * idx_stride];
    // 0 + g as the CPU's scatter_add into zeros computes it (-0.0 becomes 0.0).
    gx[offset_of(gx_rows, r) + i * gx_stride] =
        from_f32<T>(__fadd_rn(0.0f, load_f32(g + offset_of(g_rows, r) + j * g_stride)));
  }
}

}  // namespace

void topk(const void* x, DType dtype, const Strided& x_rows, std::int64_t x_stride, std::int64_t n,
          void* values, std::int64_t* indices, const Strided& out_rows, std::int64_t out_stride,
          std::int64_t k, bool largest, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  const std::int64_t rows = x_rows.numel();
  if (rows == 0 || k <= 0 || n <= 0) return;
  if (k > n) throw ShapeError("topk: k = " + std::to_string(k) + " exceeds the row size " + std::to_string(n));
  const unsigned blocks = detail::blocks_for(rows, kThreads / 32);
  detail::dispatch_floating(dtype, "topk", [&](auto tag) {
    using T = decltype(tag);
    topk_kernel<T><<<blocks, kThreads, 0, detail::as_stream(stream)>>>(
        static_cast<const T*>(x), x_rows, x_stride, n, static_cast<T*>(values), indices, out_rows, out_stride,
        rows, k, largest);
  });
  detail::check_launch("topk");
}

void topk_backward(void* grad_x, const Strided& gx_rows, std::int64_t gx_stride, const void* g,
                   const Strided& g_rows, std::int64_t g_stride, const std::int64_t* indices,
                   const Strided& idx_rows, std::int64_t idx_stride, DType dtype, std::int64_t k,
                   StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  const std::int64_t total = g_rows.numel() * k;
  if (total <= 0) return;
  const unsigned blocks = detail::blocks_for(total, kThreads);
  detail::dispatch_floating(dtype, "topk backward", [&](auto tag) {
    using T = decltype(tag);
    topk_backward_kernel<T><<<blocks, kThreads, 0, detail::as_stream(stream)>>>(
        static_cast<T*>(grad_x), gx_rows, gx_stride, static_cast<const T*>(g), g_rows, g_stride, indices,
        idx_rows, idx_stride, k, total);
  });
  detail::check_launch("topk_backward");
}

}  // namespace remat::cuda
