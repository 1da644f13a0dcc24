// Internal to the elementwise kernel families (elementwise.cu, swiglu.cu,
// dropout.cu, rotary.cu): 16-byte packs, dim coalescing, and one generic map
// kernel: out = f(in_0, ..., in_{K-1}) element by element for operands of one
// dtype, each with its own layout (broadcast inputs have stride 0), computed
// in f32 with one rounding to the element type at the end.
//
// launch_map picks the fastest of three paths:
//   dense  every operand dense and 16-byte aligned: one pack per step, then
//          the few tail elements one by one;
//   rows   packs along the innermost (coalesced) dim, whose size is a multiple
//          of the pack: operands with inner stride 1 load a pack, operands
//          broadcast along it (stride 0) load one element (e.g. x + bias[D]);
//   strided one element per step through each layout's strides.
#pragma once

#include <cstdint>

#include "cuda/kernel_util.cuh"

namespace remat::cuda::detail {

// Elements of T in a 16-byte pack (4 floats, 8 bf16 / f16).
template <typename T>
inline constexpr int kPack = int(16 / sizeof(T));

template <typename T>
struct alignas(16) Pack {
  T v[kPack<T>];
};

inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// Rewrites `count` layouts of the same sizes into the fewest dims that keep
// every element's offset: drops size-1 dims and merges neighbours where each
// layout steps evenly across both (stride[outer] == stride[inner] * size[inner]).
// A dense layout ends as one dim of stride 1 (or zero dims for one element).
inline void coalesce(Strided* ls, int count) {
  const int dim = ls[0].dim;
  int out = 0;
  for (int d = 0; d < dim; ++d) {
    const std::int64_t size = ls[0].sizes[d];
    if (size == 1) continue;
    bool merge = out > 0;
    for (int k = 0; merge && k < count; ++k)
      merge = ls[k].strides[out - 1] == ls[k].strides[d] * size;
    for (int k = 0; k < count; ++k) {
      if (merge) {
        ls[k].sizes[out - 1] *= size;
        ls[k].strides[out - 1] = ls[k].strides[d];
      } else {
        ls[k].sizes[out] = size;
        ls[k].strides[out] = ls[k].strides[d];
      }
    }
    if (!merge) ++out;
  }
  for (int k = 0; k < count; ++k) {
    for (int d = out; d < kMaxDims; ++d) {
      ls[k].sizes[d] = 0;
      ls[k].strides[d] = 0;
    }
    ls[k].dim = out;
  }
}

// One output and K inputs of element type T, with their layouts.
template <typename T, int K>
struct MapArgs {
  T* out;
  Strided out_l;
  const T* in[K];
  Strided in_l[K];
};

template <typename T>
__device__ __forceinline__ float to_f32(T v) {
  return load_f32<T>(&v);
}

template <int K, typename F>
__device__ __forceinline__ float call(const F& f, const float (&v)[K]) {
  if constexpr (K == 1) return f(v[0]);
  else if constexpr (K == 2) return f(v[0], v[1]);
  else return f(v[0], v[1], v[2]);
}

template <typename T, int K, typename F>
__global__ void map_dense_kernel(MapArgs<T, K> a, std::int64_t n, F f) {
  constexpr int P = kPack<T>;
  const std::int64_t packs = n / P;
  const std::int64_t tid = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t step = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t v = tid; v < packs; v += step) {
    Pack<T> x[K];
#pragma unroll
    for (int k = 0; k < K; ++k) x[k] = reinterpret_cast<const Pack<T>*>(a.in[k])[v];
    Pack<T> o;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      float vals[K];
#pragma unroll
      for (int k = 0; k < K; ++k) vals[k] = to_f32(x[k].v[j]);
      o.v[j] = from_f32<T>(call(f, vals));
    }
    reinterpret_cast<Pack<T>*>(a.out)[v] = o;
  }
  // The last n % P elements, one per thread of the first threads.
  const std::int64_t i = packs * P + tid;
  if (i < n) {
    float vals[K];
#pragma unroll
    for (int k = 0; k < K; ++k) vals[k] = load_f32<T>(a.in[k] + i);
    a.out[i] = from_f32<T>(call(f, vals));
  }
}

// Bit k of `bcast` set: input k is broadcast along the inner dim (stride 0).
template <typename T, int K, typename F>
__global__ void map_rows_kernel(MapArgs<T, K> a, std::int64_t n, unsigned bcast, F f) {
  constexpr int P = kPack<T>;
  const std::int64_t packs = n / P;
  for (std::int64_t v = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < packs;
       v += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t i = v * P;
    float vals[K][P];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const T* p = a.in[k] + offset_of(a.in_l[k], i);
      if ((bcast >> k) & 1u) {
        const float s = load_f32<T>(p);
#pragma unroll
        for (int j = 0; j < P; ++j) vals[k][j] = s;
      } else {
        const Pack<T> x = *reinterpret_cast<const Pack<T>*>(p);
#pragma unroll
        for (int j = 0; j < P; ++j) vals[k][j] = to_f32(x.v[j]);
      }
    }
    Pack<T> o;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      float e[K];
#pragma unroll
      for (int k = 0; k < K; ++k) e[k] = vals[k][j];
      o.v[j] = from_f32<T>(call(f, e));
    }
    *reinterpret_cast<Pack<T>*>(a.out + offset_of(a.out_l, i)) = o;
  }
}

// Bit k of `dense` set: input k is dense (offset = linear index); bit K: the output.
template <typename T, int K, typename F>
__global__ void map_strided_kernel(MapArgs<T, K> a, std::int64_t n, unsigned dense, F f) {
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    float vals[K];
#pragma unroll
    for (int k = 0; k < K; ++k)
      vals[k] = load_f32<T>(a.in[k] + (((dense >> k) & 1u) ? i : offset_of(a.in_l[k], i)));
    a.out[((dense >> K) & 1u) ? i : offset_of(a.out_l, i)] = from_f32<T>(call(f, vals));
  }
}

// out[out_l] = f(in[0][in_l[0]], ...) for every element of out_l's sizes (the
// input layouts have the same sizes). `out` may be one of the inputs with the
// same layout (an in-place update). Queues the kernel on `stream`.
template <typename T, int K, typename F>
void launch_map(const char* what, T* out, const Strided& out_l, const T* const (&in)[K],
                const Strided (&in_l)[K], F f, StreamId stream) {
  static_assert(K >= 1 && K <= 3, "launch_map takes one to three inputs");
  constexpr int P = kPack<T>;
  const std::int64_t n = out_l.numel();
  if (n == 0) return;
  Strided ls[K + 1];
  ls[0] = out_l;
  for (int k = 0; k < K; ++k) ls[k + 1] = in_l[k];
  coalesce(ls, K + 1);
  MapArgs<T, K> a;
  a.out = out;
  a.out_l = ls[0];
  for (int k = 0; k < K; ++k) {
    a.in[k] = in[k];
    a.in_l[k] = ls[k + 1];
  }
  bool all_dense = ls[0].contiguous(), all_aligned = aligned16(out);
  for (int k = 0; k < K; ++k) {
    all_dense = all_dense && ls[k + 1].contiguous();
    all_aligned = all_aligned && aligned16(in[k]);
  }
  const int threads = 256;
  const cudaStream_t s = as_stream(stream);
  if (all_dense && all_aligned) {
    map_dense_kernel<T, K, F><<<blocks_for(n / P, threads), threads, 0, s>>>(a, n, f);
    check_launch(what);
    return;
  }
  // Packs along the inner dim: its size a multiple of P, the output and every
  // non-broadcast input stepping by 1 along it, aligned at every pack.
  const int dim = ls[0].dim;
  bool rows = dim >= 1 && ls[0].sizes[dim - 1] % P == 0;
  unsigned bcast = 0;
  auto packable = [&](const Strided& l, const void* p) {
    if (l.strides[l.dim - 1] != 1 || !aligned16(p)) return false;
    for (int d = 0; d < l.dim - 1; ++d)
      if (l.strides[d] % P != 0) return false;
    return true;
  };
  rows = rows && packable(ls[0], out);
  for (int k = 0; rows && k < K; ++k) {
    if (ls[k + 1].strides[dim - 1] == 0) bcast |= 1u << k;
    else rows = packable(ls[k + 1], in[k]);
  }
  if (rows) {
    map_rows_kernel<T, K, F><<<blocks_for(n / P, threads), threads, 0, s>>>(a, n, bcast, f);
    check_launch(what);
    return;
  }
  unsigned dense = ls[0].contiguous() ? 1u << K : 0u;
  for (int k = 0; k < K; ++k)
    if (ls[k + 1].contiguous()) dense |= 1u << k;
  map_strided_kernel<T, K, F><<<blocks_for(n, threads), threads, 0, s>>>(a, n, dense, f);
  check_launch(what);
}

}  // namespace remat::cuda::detail
