// RMSNorm and LayerNorm on CUDA. Forward and the input gradient: one block
// per row (16-byte chunks, fixed-order block sums for the statistics).
// Parameter gradients: a column kernel where thread j sums column j over a
// chunk of rows into partial[chunk][j] (a warp's loads are coalesced), then a
// kernel that adds the chunks in order. Row chunks depend only on the number
// of rows, so the sums and their bits are fixed.
#include <algorithm>

#include "cuda/norm.h"
#include "cuda/row_util.cuh"
#include "engine/meta_mirror.h"

namespace remat::cuda {

namespace {

using detail::from_f32;
using detail::load_f32;
using rowwise::aligned16;
using rowwise::BlockGroup;
using rowwise::chunks_of;
using rowwise::kVec;
using rowwise::load_chunk;
using rowwise::store_chunk;

using detail::ceil_div;

// Rows per parameter-gradient chunk: at most 512 chunks, at least 32 rows each.
std::int64_t chunk_rows(std::int64_t rows) { return std::max<std::int64_t>(32, ceil_div(rows, 512)); }
std::int64_t param_chunks(std::int64_t rows) { return rows > 0 ? ceil_div(rows, chunk_rows(rows)) : 0; }

constexpr int kColThreads = 256;

// ---------------------------------------------------------------------------
// RMSNorm

template <typename T>
__global__ void __launch_bounds__(512)
    rms_forward_kernel(T* y, float* rstd, const T* x, const T* w, std::int64_t rows, std::int64_t d, float eps,
                       float inv_d) {
  __shared__ float scratch[32];
  const BlockGroup grp{scratch};
  constexpr int V = kVec<T>;
  const std::int64_t chunks = chunks_of<T>(d);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * d;
    T* yr = y + r * d;
    const bool vec = aligned16(xr) && aligned16(yr) && aligned16(w);
    float acc = 0.0f;
    for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      float v[V];
      const int m = load_chunk(xr, c, d, vec, v);
#pragma unroll
      for (int k = 0; k < V; ++k)
        if (k < m) acc += v[k] * v[k];
    }
    const float rs = 1.0f / sqrtf(grp.sum(acc) * inv_d + eps);
    if (threadIdx.x == 0) rstd[r] = rs;
    for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      float v[V], wv[V];
      const int m = load_chunk(xr, c, d, vec, v);
      load_chunk(w, c, d, vec, wv);
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = (v[k] * rs) * wv[k];
      store_chunk(yr, c, m, vec, v);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(512)
    rms_backward_dx_kernel(T* dx, const T* g, const T* x, const T* w, const float* rstd, std::int64_t rows,
                           std::int64_t d, float inv_d) {
  __shared__ float scratch[32];
  const BlockGroup grp{scratch};
  constexpr int V = kVec<T>;
  const std::int64_t chunks = chunks_of<T>(d);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* gr = g + r * d;
    const T* xr = x + r * d;
    T* o = dx + r * d;
    const bool vec = aligned16(gr) && aligned16(xr) && aligned16(o) && aligned16(w);
    float dot = 0.0f;
    for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      float gv[V], xv[V], wv[V];
      const int m = load_chunk(gr, c, d, vec, gv);
      load_chunk(xr, c, d, vec, xv);
      load_chunk(w, c, d, vec, wv);
#pragma unroll
      for (int k = 0; k < V; ++k)
        if (k < m) dot += (gv[k] * wv[k]) * xv[k];
    }
    dot = grp.sum(dot);
    const float rs = rstd[r];
    const float cc = rs * rs * dot * inv_d;
    for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      float gv[V], xv[V], wv[V];
      const int m = load_chunk(gr, c, d, vec, gv);
      load_chunk(xr, c, d, vec, xv);
      load_chunk(w, c, d, vec, wv);
#pragma unroll
      for (int k = 0; k < V; ++k) gv[k] = rs * (gv[k] * wv[k] - xv[k] * cc);
      store_chunk(o, c, m, vec, gv);
    }
  }
}

// ---------------------------------------------------------------------------
// LayerNorm

template <typename T>
__global__ void __launch_bounds__(512)
    ln_forward_kernel(T* y, float* mean, float* rstd, const T* x, const T* w, const T* b, std::int64_t rows,
                      std::int64_t d, float eps, float inv_d) {
  __shared__ float scratch[32];
  const BlockGroup grp{scratch};
  constexpr int V = kVec<T>;
  const std::int64_t chunks = chunks_of<T>(d);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * d;
    T* yr = y + r * d;
    const bool vec = aligned16(xr) && aligned16(yr) && (!w || aligned16(w)) && (!b || aligned16(b));
    float s = 0.0f;
    for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      float v[V];
      const int m = load_chunk(xr, c, d, vec, v);
#pragma unroll
      for (int k = 0; k < V; ++k)
        if (k < m) s += v[k];
    }
    const float mu = grp.sum(s) * inv_d;
    float q = 0.0f;
    for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      float v[V];
      const int m = load_chunk(xr, c, d, vec, v);
#pragma unroll
      for (int k = 0; k < V; ++k)
        if (k < m) q += (v[k] - mu) * (v[k] - mu);
    }
    const float rs = 1.0f / sqrtf(grp.sum(q) * inv_d + eps);
    if (threadIdx.x == 0) {
      mean[r] = mu;
      rstd[r] = rs;
    }
    for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      float v[V], wv[V], bv[V];
      const int m = load_chunk(xr, c, d, vec, v);
      if (w) load_chunk(w, c, d, vec, wv);
      if (b) load_chunk(b, c, d, vec, bv);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        float t = (v[k] - mu) * rs;
        if (w) t = t * wv[k];
        if (b) t = t + bv[k];
        v[k] = t;
      }
      store_chunk(yr, c, m, vec, v);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(512)
    ln_backward_dx_kernel(T* dx, const T* g, const T* x, const T* w, const float* mean, const float* rstd,
                          std::int64_t rows, std::int64_t d, float inv_d) {
  __shared__ float scratch[32];
  const BlockGroup grp{scratch};
  constexpr int V = kVec<T>;
  const std::int64_t chunks = chunks_of<T>(d);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* gr = g + r * d;
    const T* xr = x + r * d;
    T* o = dx + r * d;
    const bool vec = aligned16(gr) && aligned16(xr) && aligned16(o) && (!w || aligned16(w));
    const float mu = mean[r], rs = rstd[r];
    float s1 = 0.0f, s2 = 0.0f;
    for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      float gv[V], xv[V], wv[V];
      const int m = load_chunk(gr, c, d, vec, gv);
      load_chunk(xr, c, d, vec, xv);
      if (w) load_chunk(w, c, d, vec, wv);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        if (k >= m) continue;
        const float gw = w ? gv[k] * wv[k] : gv[k];
        s1 += gw;
        s2 += gw * ((xv[k] - mu) * rs);
      }
    }
    const float a = grp.sum(s1) * inv_d;
    const float cc = grp.sum(s2) * inv_d;
    for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      float gv[V], xv[V], wv[V];
      const int m = load_chunk(gr, c, d, vec, gv);
      load_chunk(xr, c, d, vec, xv);
      if (w) load_chunk(w, c, d, vec, wv);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float gw = w ? gv[k] * wv[k] : gv[k];
        gv[k] = rs * ((gw - a) - ((xv[k] - mu) * rs) * cc);
      }
      store_chunk(o, c, m, vec, gv);
    }
  }
}

// ---------------------------------------------------------------------------
// Parameter gradients

// Block (column block, row chunk): thread j sums column j over the chunk's
// rows in order. part_w[chunk * d + j] gets sum g * xhat (xhat = (x - mean) *
// rstd for LayerNorm, x * rstd for RMSNorm), part_b[...] gets sum g; either
// may be null.
template <typename T, bool kLayerNorm>
__global__ void __launch_bounds__(kColThreads)
    param_partial_kernel(float* part_w, float* part_b, const T* g, const T* x, const float* mean,
                         const float* rstd, std::int64_t rows, std::int64_t d, std::int64_t rows_per_chunk) {
  const std::int64_t j = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= d) return;
  const std::int64_t chunk = blockIdx.y;
  const std::int64_t r0 = chunk * rows_per_chunk;
  const std::int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float aw = 0.0f, ab = 0.0f;
  for (std::int64_t r = r0; r < r1; ++r) {
    const float gv = load_f32(g + r * d + j);
    if (part_w) {
      const float xv = load_f32(x + r * d + j);
      if constexpr (kLayerNorm) aw += gv * ((xv - mean[r]) * rstd[r]);
      else aw += gv * (xv * rstd[r]);
    }
    if (part_b) ab += gv;
  }
  if (part_w) part_w[chunk * d + j] = aw;
  if (part_b) part_b[chunk * d + j] = ab;
}

// out[j] = part[0 * d + j] + part[1 * d + j] + ..., in chunk order.
template <typename T>
__global__ void param_finish_kernel(T* out, const float* part, std::int64_t chunks, std::int64_t d) {
  for (std::int64_t j = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < d;
       j += std::int64_t(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    for (std::int64_t c = 0; c < chunks; ++c) acc += part[c * d + j];
    out[j] = from_f32<T>(acc);
  }
}

// dw (sum g * xhat) and db (sum g), each when non-null.
template <typename T, bool kLayerNorm>
void param_grads(T* dw, T* db, const T* g, const T* x, const float* mean, const float* rstd,
                 std::int64_t rows, std::int64_t d, float* workspace, cudaStream_t st, const char* what) {
  if ((!dw && !db) || d == 0) return;
  const std::int64_t per = chunk_rows(rows), chunks = param_chunks(rows);
  if (chunks > 0 && workspace == nullptr)
    throw DeviceError(std::string(what) + ": CUDA parameter gradients need a workspace (see "
                      "norm_param_grad_workspace)");
  float* part_w = dw ? workspace : nullptr;
  float* part_b = db ? workspace + (dw ? chunks * d : 0) : nullptr;
  if (chunks > 0) {
    const dim3 grid(unsigned(ceil_div(d, kColThreads)), unsigned(chunks));
    param_partial_kernel<T, kLayerNorm><<<grid, kColThreads, 0, st>>>(part_w, part_b, g, x, mean, rstd, rows, d,
                                                                     per);
  }
  const unsigned blocks = detail::blocks_for(d, 256);
  if (dw) param_finish_kernel<T><<<blocks, 256, 0, st>>>(dw, part_w, chunks, d);
  if (db) param_finish_kernel<T><<<blocks, 256, 0, st>>>(db, part_b, chunks, d);
}

}  // namespace

std::int64_t norm_param_grad_workspace(std::int64_t rows, std::int64_t d) { return param_chunks(rows) * d; }

void rms_norm_forward(void* y, float* rstd, const void* x, const void* weight, DType dtype,
                      std::int64_t rows, std::int64_t d, float eps, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  if (rows <= 0) return;
  const float inv_d = d > 0 ? 1.0f / float(d) : 0.0f;
  detail::dispatch_floating(dtype, "rms_norm", [&](auto tag) {
    using T = decltype(tag);
    rms_forward_kernel<T><<<rowwise::row_blocks(rows), rowwise::row_threads(chunks_of<T>(d)), 0,
                            detail::as_stream(stream)>>>(static_cast<T*>(y), rstd, static_cast<const T*>(x),
                                                         static_cast<const T*>(weight), rows, d, eps, inv_d);
  });
  detail::check_launch("rms_norm forward");
}

void rms_norm_backward(void* dx, void* dw, const void* grad, const void* x, const void* weight,
                       const float* rstd, DType dtype, std::int64_t rows, std::int64_t d,
                       float* workspace, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  const float inv_d = d > 0 ? 1.0f / float(d) : 0.0f;
  const cudaStream_t st = detail::as_stream(stream);
  detail::dispatch_floating(dtype, "rms_norm backward", [&](auto tag) {
    using T = decltype(tag);
    const T* g = static_cast<const T*>(grad);
    const T* xp = static_cast<const T*>(x);
    if (dx && rows > 0)
      rms_backward_dx_kernel<T><<<rowwise::row_blocks(rows), rowwise::row_threads(chunks_of<T>(d)), 0, st>>>(
          static_cast<T*>(dx), g, xp, static_cast<const T*>(weight), rstd, rows, d, inv_d);
    param_grads<T, false>(static_cast<T*>(dw), nullptr, g, xp, nullptr, rstd, rows, d, workspace, st,
                          "rms_norm backward");
  });
  detail::check_launch("rms_norm backward");
}

void layer_norm_forward(void* y, float* mean, float* rstd, const void* x, const void* weight,
                        const void* bias, DType dtype, std::int64_t rows, std::int64_t d, float eps,
                        StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  if (rows <= 0) return;
  const float inv_d = d > 0 ? 1.0f / float(d) : 0.0f;
  detail::dispatch_floating(dtype, "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    ln_forward_kernel<T><<<rowwise::row_blocks(rows), rowwise::row_threads(chunks_of<T>(d)), 0,
                           detail::as_stream(stream)>>>(static_cast<T*>(y), mean, rstd, static_cast<const T*>(x),
                                                        static_cast<const T*>(weight), static_cast<const T*>(bias),
                                                        rows, d, eps, inv_d);
  });
  detail::check_launch("layer_norm forward");
}

void layer_norm_backward(void* dx, void* dw, void* db, const void* grad, const void* x,
                         const void* weight, const float* mean, const float* rstd, DType dtype,
                         std::int64_t rows, std::int64_t d, float* workspace, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  const float inv_d = d > 0 ? 1.0f / float(d) : 0.0f;
  const cudaStream_t st = detail::as_stream(stream);
  detail::dispatch_floating(dtype, "layer_norm backward", [&](auto tag) {
    using T = decltype(tag);
    const T* g = static_cast<const T*>(grad);
    const T* xp = static_cast<const T*>(x);
    if (dx && rows > 0)
      ln_backward_dx_kernel<T><<<rowwise::row_blocks(rows), rowwise::row_threads(chunks_of<T>(d)), 0, st>>>(
          static_cast<T*>(dx), g, xp, static_cast<const T*>(weight), mean, rstd, rows, d, inv_d);
    param_grads<T, true>(static_cast<T*>(dw), static_cast<T*>(db), g, xp, mean, rstd, rows, d, workspace, st,
                         "layer_norm backward");
  });
  detail::check_launch("layer_norm backward");
}

}  // namespace remat::cuda
