// MXFP8 on CUDA, bit-identical to ops/mxfp8.cc: the block maximum is taken
// over the magnitudes' bits (NaN left out), the exponent and the scale 2^-e
// are built from bits (no ilogb or ldexp on the device), and e4m3_encode's
// branch-free integer formulas are used lane by lane with explicitly rounded
// float operations (__fmul_rn / __fadd_rn: no contraction into FMA).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/kernel_util.cuh"
#include "cuda/mxfp8.h"
#include "engine/meta_mirror.h"

namespace remat::cuda {

namespace {

using detail::from_f32;
using detail::load_f32;

constexpr int kThreads = 256;  // 8 warps: 8 blocks of 32 values per CUDA block

// ops_detail::block_exponent on the bits of a non-negative, non-NaN amax.
__device__ __forceinline__ int block_exponent_bits(std::uint32_t a) {
  if (a == 0u) return -127;
  if (a >= 0x7f800000u) return 127;  // inf
  const std::uint32_t ef = a >> 23;
  std::uint32_t m = a & 0x7fffffu;
  int lg;  // ilogb(amax)
  if (ef != 0u) {
    lg = int(ef) - 127;
  } else {  // subnormal: normalise the mantissa
    const int top = 31 - __clz(int(m));  // highest set bit (m != 0)
    lg = top - 149;
    m = (m << (23 - top)) & 0x7fffffu;
  }
  // amax * 2^-(lg - 8) = 256 * significand, in [256, 512): > 448 exactly when
  // the significand's fraction exceeds 0.75.
  int e = lg - 8 + (m > 0x600000u ? 1 : 0);
  return e < -127 ? -127 : (e > 127 ? 127 : e);
}

// 2^k for k in [-127, 127], exactly.
__device__ __forceinline__ float pow2(int k) {
  return k >= -126 ? __uint_as_float(std::uint32_t(k + 127) << 23) : __uint_as_float(0x00400000u);
}

// ops_detail::e4m3_encode, the same formulas.
__device__ __forceinline__ std::uint32_t e4m3_encode(float v) {
  const std::uint32_t bits = __float_as_uint(v);
  const std::uint32_t sign = (bits >> 24) & 0x80u;
  const std::uint32_t u = bits & 0x7fffffffu;
  const float a = __uint_as_float(u < 0x3c800000u ? u : 0u);
  const std::uint32_t sub = std::uint32_t(__fsub_rn(__fadd_rn(__fmul_rn(a, 512.0f), 8388608.0f), 8388608.0f));
  std::uint32_t nrm = ((u + 0x7ffffu + ((u >> 20) & 1u)) >> 20) - (120u << 3);
  nrm = nrm > 0x7eu ? 0x7eu : nrm;
  std::uint32_t r = u < 0x3c800000u ? sub : nrm;
  r = u > 0x7f800000u ? 0x7fu : r;
  return sign | r;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    quantize_kernel(std::uint8_t* codes, std::uint8_t* exps, const T* x, std::int64_t n, std::int64_t blocks) {
  const int lane = threadIdx.x & 31;
  const std::int64_t warps_per_grid = std::int64_t(gridDim.x) * (kThreads / 32);
  for (std::int64_t b = std::int64_t(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5); b < blocks;
       b += warps_per_grid) {
    const std::int64_t i = b * 32 + lane;
    const bool in = i < n;
    const float v = in ? load_f32(x + i) : 0.0f;
    std::uint32_t m = __float_as_uint(v) & 0x7fffffffu;
    m = m > 0x7f800000u ? 0u : m;  // NaN left out
    const std::uint32_t amax = __reduce_max_sync(0xffffffffu, m);
    const int e = block_exponent_bits(amax);
    if (lane == 0) exps[b] = std::uint8_t(e + 127);
    if (in) codes[i] = std::uint8_t(e4m3_encode(__fmul_rn(v, pow2(-e))));
  }
}

template <typename T> __device__ __forceinline__ void store_nan(T* p);
template <> __device__ __forceinline__ void store_nan<float>(float* p) { *p = __uint_as_float(0x7fc00000u); }
template <> __device__ __forceinline__ void store_nan<__nv_bfloat16>(__nv_bfloat16* p) {
  *p = __ushort_as_bfloat16(0x7fc0u);
}
template <> __device__ __forceinline__ void store_nan<__half>(__half* p) { *p = __ushort_as_half(0x7e00u); }

template <typename T>
__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(T* out, const std::uint8_t* codes, const std::uint8_t* exps, std::int64_t n) {
  for (std::int64_t i = std::int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * kThreads) {
    const std::uint32_t c = codes[i];
    const std::uint32_t ef = (c >> 3) & 0xfu, mant = c & 7u;
    if (ef == 15u && mant == 7u) {
      store_nan(out + i);
      continue;
    }
    // fp8_e4m3::to_float: mant * 2^-9, or (1 + mant / 8) * 2^(ef - 7); exact.
    float v = ef == 0u ? __fmul_rn(float(mant), pow2(-9)) : __uint_as_float(((ef + 120u) << 23) | (mant << 20));
    v = (c & 0x80u) ? -v : v;
    out[i] = from_f32<T>(__fmul_rn(v, pow2(int(exps[i >> 5]) - 127)));
  }
}

}  // namespace

void mxfp8_quantize(std::uint8_t* packed, const void* x, DType dtype, std::int64_t n, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  if (n <= 0) return;
  const std::int64_t blocks = detail::ceil_div(n, 32);
  detail::dispatch_floating(dtype, "mxfp8_quantize", [&](auto tag) {
    using T = decltype(tag);
    quantize_kernel<T><<<detail::blocks_for(blocks, kThreads / 32), kThreads, 0, detail::as_stream(stream)>>>(
        packed, packed + n, static_cast<const T*>(x), n, blocks);
  });
  detail::check_launch("mxfp8_quantize");
}

void mxfp8_dequantize(void* out, DType dtype, const std::uint8_t* packed, std::int64_t n, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  if (n <= 0) return;
  detail::dispatch_floating(dtype, "mxfp8_dequantize", [&](auto tag) {
    using T = decltype(tag);
    dequantize_kernel<T><<<detail::blocks_for(n, kThreads), kThreads, 0, detail::as_stream(stream)>>>(
        static_cast<T*>(out), packed, packed + n, n);
  });
  detail::check_launch("mxfp8_dequantize");
}

}  // namespace remat::cuda
