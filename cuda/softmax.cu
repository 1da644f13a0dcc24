// Softmax, log-softmax and cross-entropy on CUDA. A row is owned by one warp
// (rows up to 1024 elements, 8 rows per block) or one block; its elements are
// read in 16-byte chunks and its max and sums come from fixed-order warp /
// block reductions. The cross-entropy's mean over rows is a second kernel: one
// block adding the per-row losses in f64 in a fixed order.
#include <cstdint>

#include "cuda/row_util.cuh"
#include "cuda/softmax.h"
#include "engine/meta_mirror.h"

namespace remat::cuda {

namespace {

using detail::load_f32;
using rowwise::aligned16;
using rowwise::BlockGroup;
using rowwise::chunks_of;
using rowwise::kVec;
using rowwise::load_chunk;
using rowwise::store_chunk;
using rowwise::WarpGroup;

constexpr std::int64_t kWarpRowMax = 1024;  // rows up to this long: a warp per row
constexpr int kWarpRowThreads = 256;        // 8 rows per block

using detail::ceil_div;

// ---------------------------------------------------------------------------
// Softmax / log-softmax

template <typename T, typename Group>
__device__ __forceinline__ void softmax_row(T* y, const T* x, std::int64_t n, bool log, Group grp) {
  constexpr int V = kVec<T>;
  const std::int64_t chunks = chunks_of<T>(n);
  const bool vec = aligned16(x) && aligned16(y);
  float mx = -INFINITY;
  for (std::int64_t c = grp.rank(); c < chunks; c += grp.size()) {
    float v[V];
    const int m = load_chunk(x, c, n, vec, v);
#pragma unroll
    for (int k = 0; k < V; ++k)
      if (k < m) mx = fmaxf(mx, v[k]);
  }
  mx = grp.max(mx);
  float s = 0.0f;
  for (std::int64_t c = grp.rank(); c < chunks; c += grp.size()) {
    float v[V];
    const int m = load_chunk(x, c, n, vec, v);
#pragma unroll
    for (int k = 0; k < V; ++k)
      if (k < m) s += expf(v[k] - mx);
  }
  s = grp.sum(s);
  if (log) {
    const float ls = logf(s);
    for (std::int64_t c = grp.rank(); c < chunks; c += grp.size()) {
      float v[V];
      const int m = load_chunk(x, c, n, vec, v);
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = (v[k] - mx) - ls;
      store_chunk(y, c, m, vec, v);
    }
  } else {
    const float inv = 1.0f / s;
    for (std::int64_t c = grp.rank(); c < chunks; c += grp.size()) {
      float v[V];
      const int m = load_chunk(x, c, n, vec, v);
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = expf(v[k] - mx) * inv;
      store_chunk(y, c, m, vec, v);
    }
  }
}

template <typename T, typename Group>
__device__ __forceinline__ void softmax_grad_row(T* dx, const T* g, const T* y, std::int64_t n, bool log,
                                                 Group grp) {
  constexpr int V = kVec<T>;
  const std::int64_t chunks = chunks_of<T>(n);
  const bool vec = aligned16(dx) && aligned16(g) && aligned16(y);
  float s = 0.0f;
  for (std::int64_t c = grp.rank(); c < chunks; c += grp.size()) {
    float gv[V], yv[V];
    const int m = load_chunk(g, c, n, vec, gv);
    load_chunk(y, c, n, vec, yv);
#pragma unroll
    for (int k = 0; k < V; ++k)
      if (k < m) s += log ? gv[k] : gv[k] * yv[k];
  }
  s = grp.sum(s);
  for (std::int64_t c = grp.rank(); c < chunks; c += grp.size()) {
    float gv[V], yv[V];
    const int m = load_chunk(g, c, n, vec, gv);
    load_chunk(y, c, n, vec, yv);
#pragma unroll
    for (int k = 0; k < V; ++k) gv[k] = log ? gv[k] - expf(yv[k]) * s : yv[k] * (gv[k] - s);
    store_chunk(dx, c, m, vec, gv);
  }
}

// Warp: 8 rows per block, one per warp. Block: one row per block.
template <typename T, bool Warp>
__global__ void __launch_bounds__(512)
    softmax_forward_kernel(T* y, const T* x, std::int64_t rows, std::int64_t n, bool log) {
  __shared__ float scratch[32];
  const std::int64_t per_block = Warp ? blockDim.x / 32 : 1;
  const std::int64_t first = std::int64_t(blockIdx.x) * per_block + (Warp ? threadIdx.x / 32 : 0);
  for (std::int64_t r = first; r < rows; r += std::int64_t(gridDim.x) * per_block) {
    if constexpr (Warp) softmax_row(y + r * n, x + r * n, n, log, WarpGroup{});
    else softmax_row(y + r * n, x + r * n, n, log, BlockGroup{scratch});
  }
}

template <typename T, bool Warp>
__global__ void __launch_bounds__(512)
    softmax_backward_kernel(T* dx, const T* g, const T* y, std::int64_t rows, std::int64_t n, bool log) {
  __shared__ float scratch[32];
  const std::int64_t per_block = Warp ? blockDim.x / 32 : 1;
  const std::int64_t first = std::int64_t(blockIdx.x) * per_block + (Warp ? threadIdx.x / 32 : 0);
  for (std::int64_t r = first; r < rows; r += std::int64_t(gridDim.x) * per_block) {
    if constexpr (Warp) softmax_grad_row(dx + r * n, g + r * n, y + r * n, n, log, WarpGroup{});
    else softmax_grad_row(dx + r * n, g + r * n, y + r * n, n, log, BlockGroup{scratch});
  }
}

// ---------------------------------------------------------------------------
// Cross-entropy

// A block per row: lse[r] and row_loss[r] (0 for an ignored row).
template <typename T, typename I>
__global__ void __launch_bounds__(512)
    ce_forward_kernel(float* row_loss, float* lse, const T* logits, const I* targets, std::int64_t rows,
                      std::int64_t classes, std::int64_t ignore_index) {
  __shared__ float scratch[32];
  const BlockGroup grp{scratch};
  constexpr int V = kVec<T>;
  const std::int64_t chunks = chunks_of<T>(classes);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = logits + r * classes;
    const bool vec = aligned16(xr);
    float mx = -INFINITY;
    for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      float v[V];
      const int m = load_chunk(xr, c, classes, vec, v);
#pragma unroll
      for (int k = 0; k < V; ++k)
        if (k < m) mx = fmaxf(mx, v[k]);
    }
    mx = grp.max(mx);
    float s = 0.0f;
    for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      float v[V];
      const int m = load_chunk(xr, c, classes, vec, v);
#pragma unroll
      for (int k = 0; k < V; ++k)
        if (k < m) s += expf(v[k] - mx);
    }
    s = grp.sum(s);
    if (threadIdx.x == 0) {
      const float l = mx + logf(s);
      lse[r] = l;
      const std::int64_t t = std::int64_t(targets[r]);
      row_loss[r] = t == ignore_index ? 0.0f : l - load_f32(xr + t);
    }
  }
}

constexpr int kMeanThreads = 256;

// One block: *loss = (sum of row_loss in f64, fixed order) / count.
__global__ void __launch_bounds__(kMeanThreads)
    ce_mean_kernel(float* loss, const float* row_loss, std::int64_t rows, std::int64_t count) {
  __shared__ double part[kMeanThreads];
  double acc = 0.0;
  for (std::int64_t r = threadIdx.x; r < rows; r += kMeanThreads) acc += double(row_loss[r]);
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kMeanThreads / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = count > 0 ? float(part[0] / double(count)) : 0.0f;
}

// A block per row: softmax minus one-hot, times grad / count; zeros for an ignored row.
template <typename T, typename I>
__global__ void __launch_bounds__(512)
    ce_backward_kernel(T* dl, const float* grad, const T* logits, const float* lse, const I* targets,
                       std::int64_t rows, std::int64_t classes, std::int64_t ignore_index, std::int64_t count) {
  constexpr int V = kVec<T>;
  const std::int64_t chunks = chunks_of<T>(classes);
  const float scale = count > 0 ? grad[0] / float(count) : 0.0f;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = logits + r * classes;
    T* o = dl + r * classes;
    const bool vec = aligned16(xr) && aligned16(o);
    const std::int64_t t = std::int64_t(targets[r]);
    if (t == ignore_index) {
      for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
        float v[V];
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] = 0.0f;
        const std::int64_t left = classes - c * V;
        store_chunk(o, c, left < V ? int(left) : V, vec, v);
      }
      continue;
    }
    const float l = lse[r];
    for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      float v[V];
      const int m = load_chunk(xr, c, classes, vec, v);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        v[k] = expf(v[k] - l) * scale;
        if (c * V + k == t) v[k] -= scale;
      }
      store_chunk(o, c, m, vec, v);
    }
  }
}

// Calls fn(I{}) with I the C++ type of an index dtype.
template <typename Fn>
void dispatch_index(DType t, const char* what, Fn&& fn) {
  switch (t) {
    case DType::i32: fn(std::int32_t{}); return;
    case DType::i64: fn(std::int64_t{}); return;
    default:
      throw DTypeError(std::string(what) + ": targets must be i32 or i64, got " + dtype_name(t));
  }
}

}  // namespace

void softmax_forward(void* y, const void* x, DType dtype, std::int64_t rows, std::int64_t n, bool log,
                     StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  if (rows <= 0 || n <= 0) return;
  const cudaStream_t st = detail::as_stream(stream);
  detail::dispatch_floating(dtype, log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = decltype(tag);
    T* yp = static_cast<T*>(y);
    const T* xp = static_cast<const T*>(x);
    if (n <= kWarpRowMax)
      softmax_forward_kernel<T, true><<<rowwise::row_blocks(ceil_div(rows, kWarpRowThreads / 32)), kWarpRowThreads,
                                        0, st>>>(yp, xp, rows, n, log);
    else
      softmax_forward_kernel<T, false><<<rowwise::row_blocks(rows), rowwise::row_threads(chunks_of<T>(n)), 0, st>>>(
          yp, xp, rows, n, log);
  });
  detail::check_launch(log ? "log_softmax forward" : "softmax forward");
}

void softmax_backward(void* dx, const void* grad, const void* y, DType dtype, std::int64_t rows,
                      std::int64_t n, bool log, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  if (rows <= 0 || n <= 0) return;
  const cudaStream_t st = detail::as_stream(stream);
  detail::dispatch_floating(dtype, log ? "log_softmax backward" : "softmax backward", [&](auto tag) {
    using T = decltype(tag);
    T* dp = static_cast<T*>(dx);
    const T* gp = static_cast<const T*>(grad);
    const T* yp = static_cast<const T*>(y);
    if (n <= kWarpRowMax)
      softmax_backward_kernel<T, true><<<rowwise::row_blocks(ceil_div(rows, kWarpRowThreads / 32)),
                                         kWarpRowThreads, 0, st>>>(dp, gp, yp, rows, n, log);
    else
      softmax_backward_kernel<T, false><<<rowwise::row_blocks(rows), rowwise::row_threads(chunks_of<T>(n)), 0,
                                          st>>>(dp, gp, yp, rows, n, log);
  });
  detail::check_launch(log ? "log_softmax backward" : "softmax backward");
}

void cross_entropy_forward(float* loss, float* lse, const void* logits, DType dtype, const void* targets,
                           DType target_dtype, std::int64_t rows, std::int64_t classes,
                           std::int64_t ignore_index, std::int64_t count, float* workspace,
                           StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  const cudaStream_t st = detail::as_stream(stream);
  if (rows > 0) {
    if (workspace == nullptr) throw DeviceError("cross_entropy: CUDA forward needs a workspace of rows floats");
    detail::dispatch_floating(dtype, "cross_entropy", [&](auto tag) {
      using T = decltype(tag);
      dispatch_index(target_dtype, "cross_entropy", [&](auto itag) {
        using I = decltype(itag);
        ce_forward_kernel<T, I><<<rowwise::row_blocks(rows), rowwise::row_threads(chunks_of<T>(classes)), 0, st>>>(
            workspace, lse, static_cast<const T*>(logits), static_cast<const I*>(targets), rows, classes,
            ignore_index);
      });
    });
  }
  ce_mean_kernel<<<1, kMeanThreads, 0, st>>>(loss, workspace, rows, count);
  detail::check_launch("cross_entropy forward");
}

void cross_entropy_backward(void* dlogits, const float* grad, const void* logits, const float* lse,
                            DType dtype, const void* targets, DType target_dtype, std::int64_t rows,
                            std::int64_t classes, std::int64_t ignore_index, std::int64_t count,
                            StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  if (rows <= 0 || classes <= 0) return;
  const cudaStream_t st = detail::as_stream(stream);
  detail::dispatch_floating(dtype, "cross_entropy backward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(target_dtype, "cross_entropy backward", [&](auto itag) {
      using I = decltype(itag);
      ce_backward_kernel<T, I><<<rowwise::row_blocks(rows), rowwise::row_threads(chunks_of<T>(classes)), 0, st>>>(
          static_cast<T*>(dlogits), grad, static_cast<const T*>(logits), lse, static_cast<const I*>(targets), rows,
          classes, ignore_index, count);
    });
  });
  detail::check_launch("cross_entropy backward");
}

}  // namespace remat::cuda
