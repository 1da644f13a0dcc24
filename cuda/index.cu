// Indexing kernels: one thread per output element (or per 128-bit word of a
// contiguous row) over grid-stride loops. Scatter-adds never race: each
// output element is written by exactly one thread, which adds its sources in
// a fixed order, so results are the same bits on every run.
#include <cstdint>
#include <string>

#include "cuda/index.h"
#include "cuda/kernel_util.cuh"
#include "engine/meta_mirror.h"

namespace remat::cuda {

namespace {

using detail::from_f32;
using detail::load_f32;
using detail::offset_of;

constexpr int kThreads = 256;

// Calls fn(I{}) with I the index element type of `t` (i32 or i64).
template <typename Fn>
void dispatch_index(DType t, const char* what, Fn&& fn) {
  switch (t) {
    case DType::i32: fn(std::int32_t{}); return;
    case DType::i64: fn(std::int64_t{}); return;
    default:
      throw DTypeError(std::string(what) + ": index dtype must be i32 or i64, got " + dtype_name(t));
  }
}

// Calls fn(E{}) with E an unsigned integer of `bytes` bytes (raw element copies).
template <typename Fn>
void dispatch_bytes(std::size_t bytes, const char* what, Fn&& fn) {
  switch (bytes) {
    case 1: fn(std::uint8_t{}); return;
    case 2: fn(std::uint16_t{}); return;
    case 4: fn(std::uint32_t{}); return;
    case 8: fn(std::uint64_t{}); return;
    default: throw DTypeError(std::string(what) + ": unsupported element size " + std::to_string(bytes));
  }
}

// Calls fn(T{}, S{}) for the floating element types of `out` and `src`.
template <typename Fn>
void dispatch_two_floating(DType out, DType src, const char* what, Fn&& fn) {
  detail::dispatch_floating(out, what, [&](auto t) {
    detail::dispatch_floating(src, what, [&](auto s) { fn(t, s); });
  });
}

// Rows of `words` words W: out row c = x row (o * n + index[j]), c = o * k + j.
template <typename W, typename I>
__global__ void rows_kernel(W* __restrict__ out, const W* __restrict__ x, const I* __restrict__ index,
                            std::int64_t index_stride, std::int64_t n, std::int64_t k,
                            std::int64_t words, std::int64_t total) {
  for (std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t c = e / words, w = e - c * words;
    const std::int64_t o = c / k, j = c - o * k;
    const std::int64_t row = o * n + std::int64_t(index[j * index_stride]);
    out[e] = x[row * words + w];
  }
}

template <typename E, typename I>
__global__ void gather_kernel(E* __restrict__ out, Strided out_l, const E* __restrict__ x, Strided x_l,
                              const I* __restrict__ index, Strided index_l, int dim, std::int64_t total) {
  for (std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    std::int64_t rem = e, oo = 0, xo = 0, io = 0;
    for (int d = out_l.dim - 1; d >= 0; --d) {
      const std::int64_t n = out_l.sizes[d];
      const std::int64_t c = rem % n;
      rem /= n;
      oo += c * out_l.strides[d];
      io += c * index_l.strides[d];
      if (d != dim) xo += c * x_l.strides[d];
    }
    xo += std::int64_t(index[io]) * x_l.strides[dim];
    out[oo] = x[xo];
  }
}

template <typename T, typename S, typename I>
__global__ void scan_kernel(T* __restrict__ out, Strided region, const S* __restrict__ src, Strided src_l,
                            const I* __restrict__ index, Strided index_l, int dim, std::int64_t k,
                            std::int64_t total) {
  const std::int64_t sstep = src_l.strides[dim], istep = index_l.strides[dim];
  for (std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    std::int64_t rem = e, oo = 0, so = 0, io = 0, t = 0;
    for (int d = region.dim - 1; d >= 0; --d) {
      const std::int64_t n = region.sizes[d];
      const std::int64_t c = rem % n;
      rem /= n;
      oo += c * region.strides[d];
      if (d == dim) {
        t = c;
      } else {
        so += c * src_l.strides[d];
        io += c * index_l.strides[d];
      }
    }
    float acc = load_f32(out + oo);
    bool hit = false;
    for (std::int64_t j = 0; j < k; ++j)
      if (std::int64_t(index[io + j * istep]) == t) {
        acc += load_f32(src + so + j * sstep);
        hit = true;
      }
    if (hit) out[oo] = from_f32<T>(acc);
  }
}

template <typename T, typename S>
__global__ void lists_kernel(T* __restrict__ out, const S* __restrict__ src, Strided src_l,
                             const std::int64_t* __restrict__ dest, const std::int64_t* __restrict__ seg,
                             const std::int64_t* __restrict__ order, std::int64_t touched) {
  for (std::int64_t t = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < touched;
       t += std::int64_t(gridDim.x) * blockDim.x) {
    T* p = out + dest[t];
    float acc = load_f32(p);
    const std::int64_t end = seg[t + 1];
    for (std::int64_t i = seg[t]; i < end; ++i) acc += load_f32(src + offset_of(src_l, order[i]));
    *p = from_f32<T>(acc);
  }
}

// e = t * rest + r, r = o * inner + i: consecutive threads walk the inner dim
// of one destination slice (coalesced on out).
template <typename T, typename S>
__global__ void slices_kernel(T* __restrict__ out, std::int64_t n, std::int64_t inner, std::int64_t rest,
                              const S* __restrict__ src, Strided src_rest, std::int64_t src_step,
                              const std::int64_t* __restrict__ slice, const std::int64_t* __restrict__ seg,
                              const std::int64_t* __restrict__ order, std::int64_t total) {
  for (std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t t = e / rest, r = e - t * rest;
    const std::int64_t o = r / inner, i = r - o * inner;
    T* p = out + (o * n + slice[t]) * inner + i;
    const S* s = src + offset_of(src_rest, r);
    float acc = load_f32(p);
    const std::int64_t end = seg[t + 1];
    for (std::int64_t l = seg[t]; l < end; ++l) acc += load_f32(s + order[l] * src_step);
    *p = from_f32<T>(acc);
  }
}

bool aligned(const void* p, std::size_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

}  // namespace

void index_select_rows(void* out, const void* x, DType dtype, const void* index, DType index_dtype,
                       std::int64_t index_stride, std::int64_t outer, std::int64_t n, std::int64_t k,
                       std::int64_t inner, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  if (outer <= 0 || k <= 0 || inner <= 0) return;
  const std::size_t row_bytes = std::size_t(inner) * element_size(dtype);
  // The widest word that divides a row and both bases' alignment (rows then
  // start aligned too).
  std::size_t word = 16;
  while (word > 1 && !(row_bytes % word == 0 && aligned(out, word) && aligned(x, word))) word /= 2;
  const std::int64_t words = std::int64_t(row_bytes / word);
  const std::int64_t total = outer * k * words;
  const unsigned blocks = detail::blocks_for(total, kThreads);
  const cudaStream_t s = detail::as_stream(stream);
  dispatch_index(index_dtype, "index_select_rows", [&](auto itag) {
    using I = decltype(itag);
    const I* pi = static_cast<const I*>(index);
    auto launch = [&](auto wtag) {
      using W = decltype(wtag);
      rows_kernel<W, I><<<blocks, kThreads, 0, s>>>(static_cast<W*>(out), static_cast<const W*>(x), pi,
                                                   index_stride, n, k, words, total);
    };
    switch (word) {
      case 16: launch(uint4{}); break;
      case 8: launch(uint2{}); break;
      case 4: launch(std::uint32_t{}); break;
      case 2: launch(std::uint16_t{}); break;
      default: launch(std::uint8_t{}); break;
    }
  });
  detail::check_launch("index_select_rows");
}

void gather(void* out, const Strided& out_l, const void* x, const Strided& x_l, const void* index,
            DType index_dtype, const Strided& index_l, DType dtype, int dim, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  const std::int64_t total = out_l.numel();
  if (total == 0) return;
  const unsigned blocks = detail::blocks_for(total, kThreads);
  dispatch_index(index_dtype, "gather", [&](auto itag) {
    using I = decltype(itag);
    dispatch_bytes(element_size(dtype), "gather", [&](auto etag) {
      using E = decltype(etag);
      gather_kernel<E, I><<<blocks, kThreads, 0, detail::as_stream(stream)>>>(
          static_cast<E*>(out), out_l, static_cast<const E*>(x), x_l, static_cast<const I*>(index),
          index_l, dim, total);
    });
  });
  detail::check_launch("gather");
}

void scatter_add_scan(void* out, DType out_dtype, const Strided& region_l, const void* src,
                      DType src_dtype, const Strided& src_l, const void* index, DType index_dtype,
                      const Strided& index_l, int dim, std::int64_t k, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  const std::int64_t total = region_l.numel();
  if (total == 0 || k <= 0) return;
  const unsigned blocks = detail::blocks_for(total, kThreads);
  dispatch_index(index_dtype, "scatter_add", [&](auto itag) {
    using I = decltype(itag);
    dispatch_two_floating(out_dtype, src_dtype, "scatter_add", [&](auto ttag, auto stag) {
      using T = decltype(ttag);
      using S = decltype(stag);
      scan_kernel<T, S, I><<<blocks, kThreads, 0, detail::as_stream(stream)>>>(
          static_cast<T*>(out), region_l, static_cast<const S*>(src), src_l,
          static_cast<const I*>(index), index_l, dim, k, total);
    });
  });
  detail::check_launch("scatter_add_scan");
}

void scatter_add_lists(void* out, DType out_dtype, const void* src, DType src_dtype,
                       const Strided& src_l, const std::int64_t* dest, const std::int64_t* seg,
                       const std::int64_t* order, std::int64_t touched, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  if (touched <= 0) return;
  const unsigned blocks = detail::blocks_for(touched, kThreads);
  dispatch_two_floating(out_dtype, src_dtype, "scatter_add", [&](auto ttag, auto stag) {
    using T = decltype(ttag);
    using S = decltype(stag);
    lists_kernel<T, S><<<blocks, kThreads, 0, detail::as_stream(stream)>>>(
        static_cast<T*>(out), static_cast<const S*>(src), src_l, dest, seg, order, touched);
  });
  detail::check_launch("scatter_add_lists");
}

void index_add_lists(void* out, DType out_dtype, std::int64_t outer, std::int64_t n,
                     std::int64_t inner, const void* src, DType src_dtype, const Strided& src_l,
                     int dim, const std::int64_t* slice, const std::int64_t* seg,
                     const std::int64_t* order, std::int64_t touched, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  const std::int64_t rest = outer * inner;
  if (touched <= 0 || rest <= 0) return;
  // src's layout without `dim`: its row-major positions are o * inner + i.
  Strided src_rest;
  for (int d = 0; d < src_l.dim; ++d) {
    if (d == dim) continue;
    src_rest.sizes[src_rest.dim] = src_l.sizes[d];
    src_rest.strides[src_rest.dim] = src_l.strides[d];
    ++src_rest.dim;
  }
  const std::int64_t total = touched * rest;
  const unsigned blocks = detail::blocks_for(total, kThreads);
  dispatch_two_floating(out_dtype, src_dtype, "index_add", [&](auto ttag, auto stag) {
    using T = decltype(ttag);
    using S = decltype(stag);
    slices_kernel<T, S><<<blocks, kThreads, 0, detail::as_stream(stream)>>>(
        static_cast<T*>(out), n, inner, rest, static_cast<const S*>(src), src_rest, src_l.strides[dim],
        slice, seg, order, total);
  });
  detail::check_launch("index_add_lists");
}

}  // namespace remat::cuda
