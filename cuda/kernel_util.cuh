// Helpers shared by the .cu files of cuda/ (internal): element loads and
// stores that convert to and from f32, strided offsets, launch sizing and
// error checks, and dispatch from a DType to a kernel's element type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/check.h"
#include "cuda/strided.h"
#include "engine/dtype.h"
#include "engine/error.h"
#include "engine/memory_backend.h"

namespace remat::cuda::detail {

// Throws DeviceError naming the kernel if its launch failed.
inline void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw DeviceError(std::string("CUDA kernel ") + what + " failed to launch: " + cudaGetErrorString(err));
}

// ceil(a / b) for positive b.
__host__ __device__ __forceinline__ std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Blocks for `n` items at `threads` per block, capped for grid-stride loops.
inline unsigned blocks_for(std::int64_t n, int threads, std::int64_t cap = 65535LL * 32) {
  std::int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  return unsigned(b < cap ? b : cap);
}

template <typename T> __device__ __forceinline__ float load_f32(const T* p);
template <> __device__ __forceinline__ float load_f32<float>(const float* p) { return *p; }
template <> __device__ __forceinline__ float load_f32<__nv_bfloat16>(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}
template <> __device__ __forceinline__ float load_f32<__half>(const __half* p) { return __half2float(*p); }

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }

// Element offset of linear (row-major) index i in layout s. A 64-bit
// division costs tens of instructions on the GPU, a 32-bit one a few: the
// index is divided in 64 bits only while it needs more than 32 (a size
// above 32 bits then leaves the 32-bit rest whole).
__device__ __forceinline__ std::int64_t offset_of(const Strided& s, std::int64_t i) {
  std::int64_t off = 0;
  int d = s.dim - 1;
  for (; d >= 0 && i > 0xffffffffLL; --d) {
    const std::int64_t n = s.sizes[d];
    off += (i % n) * s.strides[d];
    i /= n;
  }
  std::uint32_t j = std::uint32_t(i);
  for (; d >= 0; --d) {
    const std::int64_t n = s.sizes[d];
    if (n > 0xffffffffLL) {  // j < n: all of it is this dim's index
      off += std::int64_t(j) * s.strides[d];
      j = 0;
      continue;
    }
    const std::uint32_t m = std::uint32_t(n);
    off += std::int64_t(j % m) * s.strides[d];
    j /= m;
  }
  return off;
}

// Calls fn(T{}) with T the CUDA element type of a floating dtype (float,
// __nv_bfloat16, __half); throws DTypeError for other dtypes.
template <typename Fn>
void dispatch_floating(DType t, const char* what, Fn&& fn) {
  switch (t) {
    case DType::f32: fn(float{}); return;
    case DType::bf16: fn(__nv_bfloat16{}); return;
    case DType::f16: fn(__half{}); return;
    default:
      throw DTypeError(std::string(what) + ": no CUDA kernel for dtype " + dtype_name(t) +
                       " (expected f32, bf16 or f16)");
  }
}

// Warp-level sum and max (full warp participating).
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024), returned to
// every thread. The order of additions is fixed for a given blockDim, so the
// result is deterministic. `scratch` holds 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

}  // namespace remat::cuda::detail
