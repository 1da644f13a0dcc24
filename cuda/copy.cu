// Strided copy with conversion, and fill: one thread per element over a
// grid-stride loop. Offsets come from the layouts, so any view (transpose,
// expand, narrow) is read or written in place.
#include <cuda_fp8.h>

#include "cuda/copy.h"
#include "cuda/kernel_util.cuh"
#include "engine/meta_mirror.h"

namespace remat::cuda {

namespace {

using detail::offset_of;

// The CUDA element type of each dtype.
template <DType D> struct Elem;
template <> struct Elem<DType::f32> { using T = float; };
template <> struct Elem<DType::bf16> { using T = __nv_bfloat16; };
template <> struct Elem<DType::f16> { using T = __half; };
template <> struct Elem<DType::i32> { using T = std::int32_t; };
template <> struct Elem<DType::i64> { using T = std::int64_t; };
template <> struct Elem<DType::boolean> { using T = std::uint8_t; };
template <> struct Elem<DType::fp8_e4m3> { using T = __nv_fp8_e4m3; };

template <typename T> constexpr bool kFloating = false;
template <> constexpr bool kFloating<float> = true;
template <> constexpr bool kFloating<__nv_bfloat16> = true;
template <> constexpr bool kFloating<__half> = true;
template <> constexpr bool kFloating<__nv_fp8_e4m3> = true;

template <typename From>
__device__ __forceinline__ float as_float(From v) {
  if constexpr (std::is_same_v<From, float>) return v;
  else if constexpr (std::is_same_v<From, __nv_bfloat16>) return __bfloat162float(v);
  else if constexpr (std::is_same_v<From, __half>) return __half2float(v);
  else if constexpr (std::is_same_v<From, __nv_fp8_e4m3>) return float(v);
  else return float(v);
}

template <typename To, typename From>
__device__ __forceinline__ To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, std::uint8_t>) {
    if constexpr (kFloating<From>) return as_float(v) != 0.0f ? 1 : 0;
    else return v != 0 ? 1 : 0;
  } else if constexpr (std::is_same_v<To, float>) {
    return as_float(v);
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    return __float2bfloat16_rn(as_float(v));
  } else if constexpr (std::is_same_v<To, __half>) {
    return __float2half_rn(as_float(v));
  } else if constexpr (std::is_same_v<To, __nv_fp8_e4m3>) {
    return __nv_fp8_e4m3(as_float(v));
  } else {  // integer destination
    if constexpr (kFloating<From>) return To(as_float(v));
    else return To(v);
  }
}

template <typename To, typename From>
__global__ void copy_kernel(To* dst, Strided dl, const From* src, Strided sl, std::int64_t n) {
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    dst[offset_of(dl, i)] = convert<To>(src[offset_of(sl, i)]);
}

// Contiguous on both sides: no offset arithmetic.
template <typename To, typename From>
__global__ void copy_dense_kernel(To* dst, const From* src, std::int64_t n) {
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    dst[i] = convert<To>(src[i]);
}

template <typename T>
__global__ void fill_kernel(T* dst, std::int64_t n, T value) {
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    dst[i] = value;
}

template <typename Fn>
void dispatch_all(DType t, Fn&& fn) {
  switch (t) {
    case DType::f32: fn(Elem<DType::f32>::T{}); return;
    case DType::bf16: fn(Elem<DType::bf16>::T{}); return;
    case DType::f16: fn(Elem<DType::f16>::T{}); return;
    case DType::i32: fn(Elem<DType::i32>::T{}); return;
    case DType::i64: fn(Elem<DType::i64>::T{}); return;
    case DType::boolean: fn(Elem<DType::boolean>::T{}); return;
    case DType::fp8_e4m3: fn(Elem<DType::fp8_e4m3>::T{}); return;
  }
}

}  // namespace

void copy_strided(void* dst, DType dst_dtype, const Strided& dst_l, const void* src, DType src_dtype,
                  const Strided& src_l, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  const std::int64_t n = dst_l.numel();
  if (n == 0) return;
  const bool dense = dst_l.contiguous() && src_l.contiguous();
  if (dense && dst_dtype == src_dtype) {
    detail::check_cuda(cudaMemcpyAsync(dst, src, std::size_t(n) * element_size(dst_dtype),
                                       cudaMemcpyDeviceToDevice, detail::as_stream(stream)),
                       "device-to-device copy");
    return;
  }
  const int threads = 256;
  const unsigned blocks = detail::blocks_for(n, threads);
  dispatch_all(dst_dtype, [&](auto to) {
    using To = decltype(to);
    dispatch_all(src_dtype, [&](auto from) {
      using From = decltype(from);
      if (dense)
        copy_dense_kernel<To, From><<<blocks, threads, 0, detail::as_stream(stream)>>>(
            static_cast<To*>(dst), static_cast<const From*>(src), n);
      else
        copy_kernel<To, From><<<blocks, threads, 0, detail::as_stream(stream)>>>(
            static_cast<To*>(dst), dst_l, static_cast<const From*>(src), src_l, n);
    });
  });
  detail::check_launch("copy_strided");
}

void fill(void* dst, DType dtype, std::int64_t n, double value, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  if (n <= 0) return;
  const int threads = 256;
  const unsigned blocks = detail::blocks_for(n, threads);
  dispatch_all(dtype, [&](auto tag) {
    using T = decltype(tag);
    T v;
    if constexpr (std::is_same_v<T, float>) v = float(value);
    else if constexpr (std::is_same_v<T, __nv_bfloat16>) v = __float2bfloat16_rn(float(value));
    else if constexpr (std::is_same_v<T, __half>) v = __float2half_rn(float(value));
    else if constexpr (std::is_same_v<T, __nv_fp8_e4m3>) v = __nv_fp8_e4m3(float(value));
    else if constexpr (std::is_same_v<T, std::uint8_t>) v = value != 0.0 ? 1 : 0;
    else v = T(value);
    fill_kernel<T><<<blocks, threads, 0, detail::as_stream(stream)>>>(static_cast<T*>(dst), n, v);
  });
  detail::check_launch("fill");
}

}  // namespace remat::cuda
