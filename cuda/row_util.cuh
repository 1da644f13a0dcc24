// Helpers for the row-wise kernels of reduce.cu, norm.cu and softmax.cu
// (internal, namespace cuda::rowwise): rows read and written in 16-byte
// chunks, and the group of threads (a warp or a whole block) that shares one
// row.
//
// A row of n elements is cut into chunks of kVec<T> elements (16 bytes);
// chunk c covers [c * kVec, min(n, c * kVec + kVec)). Thread `rank` of a group
// of `size` threads handles chunks rank, rank + size, ... in that order. A full
// chunk of a 16-byte aligned row is moved with one vector load or store,
// anything else element by element; the values, and so every sum built from
// them, are the same either way, so results never depend on alignment.
#pragma once

#include <cstdint>

#include "cuda/kernel_util.cuh"

namespace remat::cuda::rowwise {

using detail::block_max;
using detail::block_sum;
using detail::from_f32;
using detail::load_f32;
using detail::warp_max;
using detail::warp_sum;

// Elements of T per 16-byte vector.
template <typename T>
inline constexpr int kVec = int(16 / sizeof(T));

// Chunks of kVec<T> elements in a row of n elements.
template <typename T>
__host__ __device__ __forceinline__ std::int64_t chunks_of(std::int64_t n) {
  return (n + kVec<T> - 1) / kVec<T>;
}

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}

// Loads chunk c of the n-element row p as floats into v (entries past the row
// end are 0) and returns how many are valid. `vec`: p is 16-byte aligned.
template <typename T>
__device__ __forceinline__ int load_chunk(const T* p, std::int64_t c, std::int64_t n, bool vec,
                                          float (&v)[kVec<T>]) {
  constexpr int V = kVec<T>;
  const std::int64_t base = c * V;
  if (vec && base + V <= n) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p + base);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = load_f32<T>(e + k);
    return V;
  }
  const std::int64_t left = n - base;
  const int m = left < V ? int(left) : V;
#pragma unroll
  for (int k = 0; k < V; ++k) v[k] = k < m ? load_f32<T>(p + base + k) : 0.0f;
  return m;
}

// Stores the first m entries of v (rounded to T) as chunk c of row p.
template <typename T>
__device__ __forceinline__ void store_chunk(T* p, std::int64_t c, int m, bool vec, const float (&v)[kVec<T>]) {
  constexpr int V = kVec<T>;
  const std::int64_t base = c * V;
  if (vec && m == V) {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int k = 0; k < V; ++k) e[k] = from_f32<T>(v[k]);
    *reinterpret_cast<uint4*>(p + base) = raw;
    return;
  }
#pragma unroll
  for (int k = 0; k < V; ++k)
    if (k < m) p[base + k] = from_f32<T>(v[k]);
}

// The 32 lanes of one warp share a row (all lanes must take part).
struct WarpGroup {
  __device__ __forceinline__ int rank() const { return int(threadIdx.x & 31); }
  __device__ __forceinline__ int size() const { return 32; }
  __device__ __forceinline__ float sum(float v) const { return warp_sum(v); }
  __device__ __forceinline__ float max(float v) const { return warp_max(v); }
};

// The whole block shares a row (every thread must take part). scratch: 32
// floats of shared memory.
struct BlockGroup {
  float* scratch;
  __device__ __forceinline__ int rank() const { return int(threadIdx.x); }
  __device__ __forceinline__ int size() const { return int(blockDim.x); }
  __device__ __forceinline__ float sum(float v) const { return block_sum(v, scratch); }
  __device__ __forceinline__ float max(float v) const { return block_max(v, scratch); }
};

// Threads for a block that owns one row of `chunks` chunks: one chunk per
// thread up to `cap`, a multiple of 32. Depends on the row length only.
inline int row_threads(std::int64_t chunks, int cap = 512) {
  std::int64_t t = (chunks + 31) / 32 * 32;
  if (t < 32) t = 32;
  if (t > cap) t = cap;
  return int(t);
}

// Grid size for one block per row (grid-stride beyond the cap).
inline unsigned row_blocks(std::int64_t rows, std::int64_t cap = 65535LL * 16) {
  if (rows < 1) return 1;
  return unsigned(rows < cap ? rows : cap);
}

}  // namespace remat::cuda::rowwise
