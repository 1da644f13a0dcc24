// Sums and maxima over dims on CUDA. The host side first simplifies both
// layouts (drops size-1 dims, merges dims that are contiguous with each
// other), then picks a kernel from the strides:
//  - rows: the reduced elements of one output lie closer together than two
//    outputs do (a sum over the last dim): a warp (rows up to 1024 elements)
//    or a block per output, threads striding over the row, then a
//    fixed-order warp / block reduction. A few very long rows are cut into
//    chunks whose partial sums a second kernel adds in chunk order.
//  - columns: neighbouring outputs are neighbours in memory (a sum over a
//    leading dim), or rows are very short: one thread per output summing its
//    elements in order, so a warp's loads are coalesced; long columns with few
//    outputs are cut into chunks the same way.
// The choice and the chunking depend only on the shapes and strides, never on
// timing, so every run gives the same bits.
#include <algorithm>
#include <type_traits>

#include "cuda/reduce.h"
#include "cuda/row_util.cuh"
#include "engine/meta_mirror.h"

namespace remat::cuda {

namespace {

using detail::from_f32;
using detail::load_f32;
using detail::offset_of;
using rowwise::BlockGroup;
using rowwise::kVec;
using rowwise::WarpGroup;

__host__ __device__ __forceinline__ std::int64_t imin(std::int64_t a, std::int64_t b) { return a < b ? a : b; }
using detail::ceil_div;

// Drops size-1 dims and merges neighbours whose strides make them one dim;
// the linear index -> offset map is unchanged.
Strided coalesce(const Strided& s) {
  Strided c;
  c.dim = 0;
  for (int d = 0; d < s.dim; ++d) {
    if (s.sizes[d] == 1) continue;
    if (c.dim > 0 && c.strides[c.dim - 1] == s.strides[d] * s.sizes[d]) {
      c.sizes[c.dim - 1] *= s.sizes[d];
      c.strides[c.dim - 1] = s.strides[d];
    } else {
      c.sizes[c.dim] = s.sizes[d];
      c.strides[c.dim] = s.strides[d];
      ++c.dim;
    }
  }
  return c;
}

std::int64_t min_stride(const Strided& s) {
  std::int64_t m = INT64_MAX;
  for (int d = 0; d < s.dim; ++d) m = std::min(m, s.strides[d] < 0 ? -s.strides[d] : s.strides[d]);
  return m;
}

// How the elements of a row are addressed.
enum RowMode : int {
  kContiguous = 0,  // one dim of stride 1: 16-byte chunks
  kStrided1 = 1,    // one dim of another stride
  kGeneral = 2,     // several dims: offset_of per element
};

constexpr std::int64_t kShortRow = 16;         // rows this short go to the column kernel
constexpr std::int64_t kWarpRowMax = 1024;     // rows up to this long: a warp per output
constexpr std::int64_t kRowChunkMin = 8192;    // chunked rows: at least this many elements per chunk
constexpr std::int64_t kRowTargetItems = 1024; // chunk rows until about this many (output, chunk) items
constexpr std::int64_t kColChunkMin = 64;      // chunked columns: at least this many per chunk
constexpr std::int64_t kColTargetItems = 1 << 16;

struct SumPlan {
  Strided kept, reduced;  // coalesced
  std::int64_t outputs = 0, count = 0;
  bool rows = false;
  int mode = kGeneral;
  bool warp = false;
  int threads = 256;
  std::int64_t chunks = 1, chunk_len = 0;
};

SumPlan plan_sum(const Strided& kept, const Strided& reduced) {
  SumPlan p;
  p.kept = coalesce(kept);
  p.reduced = coalesce(reduced);
  p.outputs = p.kept.numel();
  p.count = p.reduced.numel();
  p.chunk_len = p.count;
  if (p.outputs == 0 || p.count == 0) return p;
  if (p.count <= kShortRow) p.rows = false;
  else if (p.kept.dim == 0) p.rows = true;
  else p.rows = min_stride(p.reduced) < min_stride(p.kept);
  if (p.rows) {
    p.mode = p.reduced.dim == 1 ? (p.reduced.strides[0] == 1 ? kContiguous : kStrided1) : kGeneral;
    p.warp = p.count <= kWarpRowMax;
    p.threads = p.warp ? 256 : (p.count >= 16384 ? 512 : 256);
    if (!p.warp && p.outputs < kRowTargetItems) {
      const std::int64_t want =
          std::min(ceil_div(p.count, kRowChunkMin), ceil_div(kRowTargetItems, p.outputs));
      if (want > 1) {
        // A multiple of 32 elements keeps every chunk 16-byte aligned with its row.
        p.chunk_len = ceil_div(ceil_div(p.count, want), 32) * 32;
        p.chunks = ceil_div(p.count, p.chunk_len);
      }
    }
  } else if (p.outputs < kColTargetItems) {
    const std::int64_t want =
        std::min(ceil_div(p.count, kColChunkMin), ceil_div(kColTargetItems, p.outputs));
    if (want > 1) {
      p.chunk_len = ceil_div(p.count, want);
      p.chunks = ceil_div(p.count, p.chunk_len);
    }
  }
  if (p.chunks <= 1) {
    p.chunks = 1;
    p.chunk_len = p.count;
  }
  return p;
}

// ---------------------------------------------------------------------------
// Sum kernels

// The group's sum of elements [r0, r1) of the row at `base`.
template <typename T, int M, typename Group>
__device__ __forceinline__ float sum_row(const T* base, const Strided& red, std::int64_t r0,
                                         std::int64_t r1, Group g) {
  float acc = 0.0f;
  if constexpr (M == kContiguous) {
    const T* p = base + r0;
    const std::int64_t n = r1 - r0, chunks = rowwise::chunks_of<T>(n);
    const bool vec = rowwise::aligned16(p);
    for (std::int64_t c = g.rank(); c < chunks; c += g.size()) {
      float v[kVec<T>];
      const int m = rowwise::load_chunk(p, c, n, vec, v);
#pragma unroll
      for (int k = 0; k < kVec<T>; ++k)
        if (k < m) acc += v[k];
    }
  } else if constexpr (M == kStrided1) {
    const std::int64_t st = red.strides[0];
    for (std::int64_t r = r0 + g.rank(); r < r1; r += g.size()) acc += load_f32(base + r * st);
  } else {
    for (std::int64_t r = r0 + g.rank(); r < r1; r += g.size()) acc += load_f32(base + offset_of(red, r));
  }
  return g.sum(acc);
}

// Item k = (chunk c, output o) with k = c * outputs + o; a warp or a block per
// item. One chunk: out[o] = scale * sum. Several: partial[k] = sum.
template <typename T, int M, bool Warp>
__global__ void __launch_bounds__(512)
    sum_rows_kernel(T* out, float* partial, const T* in, Strided kept, Strided red, std::int64_t outputs,
                    std::int64_t count, std::int64_t chunks, std::int64_t chunk_len, float scale) {
  __shared__ float scratch[32];
  const std::int64_t items = outputs * chunks;
  const std::int64_t per_block = Warp ? blockDim.x / 32 : 1;
  const std::int64_t first = std::int64_t(blockIdx.x) * per_block + (Warp ? threadIdx.x / 32 : 0);
  const bool leader = (Warp ? (threadIdx.x & 31) : threadIdx.x) == 0;
  for (std::int64_t k = first; k < items; k += std::int64_t(gridDim.x) * per_block) {
    const std::int64_t c = k / outputs, o = k - c * outputs;
    const std::int64_t r0 = c * chunk_len, r1 = imin(count, r0 + chunk_len);
    const T* base = in + offset_of(kept, o);
    float s;
    if constexpr (Warp) s = sum_row<T, M>(base, red, r0, r1, WarpGroup{});
    else s = sum_row<T, M>(base, red, r0, r1, BlockGroup{scratch});
    if (leader) {
      if (chunks == 1) out[o] = from_f32<T>(s * scale);
      else partial[k] = s;
    }
  }
}

// A thread per item (chunk c, output o): its elements summed in order.
template <typename T>
__global__ void sum_cols_kernel(T* out, float* partial, const T* in, Strided kept, Strided red,
                                std::int64_t outputs, std::int64_t count, std::int64_t chunks,
                                std::int64_t chunk_len, float scale) {
  const std::int64_t items = outputs * chunks;
  for (std::int64_t k = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < items;
       k += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t c = k / outputs, o = k - c * outputs;
    const std::int64_t r0 = c * chunk_len, r1 = imin(count, r0 + chunk_len);
    const T* base = in + offset_of(kept, o);
    float acc = 0.0f;
    if (red.dim <= 1) {
      const std::int64_t st = red.dim == 1 ? red.strides[0] : 0;
      for (std::int64_t r = r0; r < r1; ++r) acc += load_f32(base + r * st);
    } else {
      for (std::int64_t r = r0; r < r1; ++r) acc += load_f32(base + offset_of(red, r));
    }
    if (chunks == 1) out[o] = from_f32<T>(acc * scale);
    else partial[k] = acc;
  }
}

// out[o] = scale * (partial[0 * outputs + o] + partial[1 * outputs + o] + ...), in chunk order.
template <typename T>
__global__ void sum_partials_kernel(T* out, const float* partial, std::int64_t outputs, std::int64_t chunks,
                                    float scale) {
  for (std::int64_t o = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < outputs;
       o += std::int64_t(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    for (std::int64_t c = 0; c < chunks; ++c) acc += partial[c * outputs + o];
    out[o] = from_f32<T>(acc * scale);
  }
}

// ---------------------------------------------------------------------------
// Max kernels

struct ArgMax {
  float v;
  std::int64_t i;
};

// The better of two candidates as the CPU's left-to-right scan would pick it:
// a NaN beats numbers, a larger value beats a smaller one, and ties (two
// NaNs, equal values) go to the lower index. Commutative and associative, so
// any reduction tree gives the scan's answer.
__device__ __forceinline__ ArgMax pick(ArgMax a, ArgMax b) {
  const bool an = isnan(a.v), bn = isnan(b.v);
  if (an != bn) return an ? a : b;
  if (!an && a.v != b.v) return a.v > b.v ? a : b;
  return a.i <= b.i ? a : b;
}

__device__ __forceinline__ ArgMax no_candidate() { return ArgMax{-INFINITY, INT64_MAX}; }

__device__ __forceinline__ ArgMax warp_argmax(ArgMax a) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    ArgMax b;
    b.v = __shfl_xor_sync(0xffffffffu, a.v, o);
    b.i = __shfl_xor_sync(0xffffffffu, a.i, o);
    a = pick(a, b);
  }
  return a;
}

__device__ __forceinline__ ArgMax block_argmax(ArgMax a, ArgMax* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  a = warp_argmax(a);
  __syncthreads();
  if (lane == 0) scratch[warp] = a;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  a = lane < warps ? scratch[lane] : no_candidate();
  return warp_argmax(a);
}

// A warp or a block per output; the row has count >= 1 elements at `stride`.
template <typename T, bool Warp>
__global__ void __launch_bounds__(512)
    max_rows_kernel(T* values, std::int64_t* index, const T* in, Strided kept, std::int64_t outputs,
                    std::int64_t count, std::int64_t stride) {
  __shared__ ArgMax scratch[32];
  const std::int64_t per_block = Warp ? blockDim.x / 32 : 1;
  const std::int64_t first = std::int64_t(blockIdx.x) * per_block + (Warp ? threadIdx.x / 32 : 0);
  const int rank = Warp ? int(threadIdx.x & 31) : int(threadIdx.x);
  const int size = Warp ? 32 : int(blockDim.x);
  for (std::int64_t o = first; o < outputs; o += std::int64_t(gridDim.x) * per_block) {
    const T* base = in + offset_of(kept, o);
    ArgMax best = no_candidate();
    if (stride == 1) {
      const std::int64_t chunks = rowwise::chunks_of<T>(count);
      const bool vec = rowwise::aligned16(base);
      for (std::int64_t c = rank; c < chunks; c += size) {
        float v[kVec<T>];
        const int m = rowwise::load_chunk(base, c, count, vec, v);
#pragma unroll
        for (int k = 0; k < kVec<T>; ++k)
          if (k < m) best = pick(best, ArgMax{v[k], c * kVec<T> + k});
      }
    } else {
      for (std::int64_t i = rank; i < count; i += size) best = pick(best, ArgMax{load_f32(base + i * stride), i});
    }
    if constexpr (Warp) best = warp_argmax(best);
    else best = block_argmax(best, scratch);
    if (rank == 0) {
      values[o] = base[best.i * stride];
      index[o] = best.i;
    }
  }
}

// A thread per output: the CPU's scan, element by element.
template <typename T>
__global__ void max_cols_kernel(T* values, std::int64_t* index, const T* in, Strided kept, std::int64_t outputs,
                                std::int64_t count, std::int64_t stride) {
  for (std::int64_t o = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < outputs;
       o += std::int64_t(gridDim.x) * blockDim.x) {
    const T* base = in + offset_of(kept, o);
    std::int64_t best = 0;
    float bv = load_f32(base);
    for (std::int64_t i = 1; i < count; ++i) {
      const float v = load_f32(base + i * stride);
      if (v > bv || (isnan(v) && !isnan(bv))) {
        best = i;
        bv = v;
      }
    }
    values[o] = base[best * stride];
    index[o] = best;
  }
}

template <typename T>
__global__ void max_backward_kernel(T* dx, Strided kept, std::int64_t stride, const T* grad,
                                    const std::int64_t* index, std::int64_t outputs) {
  for (std::int64_t o = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < outputs;
       o += std::int64_t(gridDim.x) * blockDim.x)
    dx[offset_of(kept, o) + index[o] * stride] = from_f32<T>(0.0f + load_f32(grad + o));
}

template <int M>
using ModeTag = std::integral_constant<int, M>;

}  // namespace

std::int64_t reduce_sum_workspace(const Strided& kept, const Strided& reduced) {
  const SumPlan p = plan_sum(kept, reduced);
  return p.chunks > 1 ? p.chunks * p.outputs : 0;
}

void reduce_sum(void* out, const void* in, DType dtype, const Strided& kept, const Strided& reduced,
                float scale, float* workspace, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  const SumPlan p = plan_sum(kept, reduced);
  if (p.outputs == 0) return;
  if (p.chunks > 1 && workspace == nullptr)
    throw DeviceError("sum: CUDA reduction needs a workspace of " + std::to_string(p.chunks * p.outputs) +
                      " floats (see reduce_sum_workspace)");
  const cudaStream_t st = detail::as_stream(stream);
  const std::int64_t items = p.outputs * p.chunks;
  detail::dispatch_floating(dtype, "sum", [&](auto tag) {
    using T = decltype(tag);
    T* o = static_cast<T*>(out);
    const T* x = static_cast<const T*>(in);
    if (p.rows) {
      auto launch = [&](auto mode) {
        constexpr int M = decltype(mode)::value;
        if (p.warp) {
          const std::int64_t per_block = p.threads / 32;
          sum_rows_kernel<T, M, true><<<rowwise::row_blocks(ceil_div(items, per_block)), p.threads, 0, st>>>(
              o, workspace, x, p.kept, p.reduced, p.outputs, p.count, p.chunks, p.chunk_len, scale);
        } else {
          sum_rows_kernel<T, M, false><<<rowwise::row_blocks(items), p.threads, 0, st>>>(
              o, workspace, x, p.kept, p.reduced, p.outputs, p.count, p.chunks, p.chunk_len, scale);
        }
      };
      switch (p.mode) {
        case kContiguous: launch(ModeTag<kContiguous>{}); break;
        case kStrided1: launch(ModeTag<kStrided1>{}); break;
        default: launch(ModeTag<kGeneral>{}); break;
      }
    } else {
      sum_cols_kernel<T><<<detail::blocks_for(items, p.threads), p.threads, 0, st>>>(
          o, workspace, x, p.kept, p.reduced, p.outputs, p.count, p.chunks, p.chunk_len, scale);
    }
    if (p.chunks > 1)
      sum_partials_kernel<T><<<detail::blocks_for(p.outputs, 256), 256, 0, st>>>(o, workspace, p.outputs,
                                                                                 p.chunks, scale);
  });
  detail::check_launch("sum");
}

void reduce_max(void* values, std::int64_t* index, const void* in, DType dtype, const Strided& kept_in,
                std::int64_t count, std::int64_t stride, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  const Strided kept = coalesce(kept_in);
  const std::int64_t outputs = kept.numel();
  if (outputs == 0) return;
  if (count < 1) throw ShapeError("max: CUDA reduction over an empty dim");
  const bool rows = count > kShortRow && (kept.dim == 0 || (stride < 0 ? -stride : stride) < min_stride(kept));
  const cudaStream_t st = detail::as_stream(stream);
  detail::dispatch_floating(dtype, "max", [&](auto tag) {
    using T = decltype(tag);
    T* v = static_cast<T*>(values);
    const T* x = static_cast<const T*>(in);
    if (!rows) {
      max_cols_kernel<T><<<detail::blocks_for(outputs, 256), 256, 0, st>>>(v, index, x, kept, outputs, count,
                                                                          stride);
    } else if (count <= kWarpRowMax) {
      max_rows_kernel<T, true><<<rowwise::row_blocks(ceil_div(outputs, 8)), 256, 0, st>>>(v, index, x, kept,
                                                                                         outputs, count, stride);
    } else {
      const int threads = count >= 16384 ? 512 : 256;
      max_rows_kernel<T, false><<<rowwise::row_blocks(outputs), threads, 0, st>>>(v, index, x, kept, outputs,
                                                                                count, stride);
    }
  });
  detail::check_launch("max");
}

void reduce_max_backward(void* dx, const Strided& kept_in, std::int64_t stride, const void* grad,
                         const std::int64_t* index, DType dtype, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  const Strided kept = coalesce(kept_in);
  const std::int64_t outputs = kept.numel();
  if (outputs == 0) return;
  detail::dispatch_floating(dtype, "max backward", [&](auto tag) {
    using T = decltype(tag);
    max_backward_kernel<T><<<detail::blocks_for(outputs, 256), 256, 0, detail::as_stream(stream)>>>(
        static_cast<T*>(dx), kept, stride, static_cast<const T*>(grad), index, outputs);
  });
  detail::check_launch("max backward");
}

}  // namespace remat::cuda
