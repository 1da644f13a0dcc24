// Gradient accumulation and broadcast-undoing sums on CUDA.
#include <type_traits>

#include "cuda/accumulate.h"
#include "cuda/kernel_util.cuh"
#include "engine/meta_mirror.h"

namespace remat::cuda {

namespace {

using detail::load_f32;
using detail::offset_of;

template <typename D, typename S>
__global__ void add_into_kernel(D* dst, Strided dl, const S* src, Strided sl, std::int64_t n) {
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    D* p = dst + offset_of(dl, i);
    float v = load_f32(src + offset_of(sl, i));
    if constexpr (!std::is_same_v<D, S>) {
      // The CPU first converts the gradient to dst's dtype (g.to(acc.dtype())).
      const D r = detail::from_f32<D>(v);
      v = load_f32(&r);
    }
    *p = detail::from_f32<D>(load_f32(p) + v);
  }
}

// Both contiguous (a parameter's gradient, the common case): no offsets.
template <typename D, typename S>
__global__ void add_into_dense_kernel(D* dst, const S* src, std::int64_t n) {
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    float v = load_f32(src + i);
    if constexpr (!std::is_same_v<D, S>) {  // as add_into_kernel
      const D r = detail::from_f32<D>(v);
      v = load_f32(&r);
    }
    dst[i] = detail::from_f32<D>(load_f32(dst + i) + v);
  }
}

// One thread per output: a sequential f32 sum over r in order.
template <typename T>
__global__ void sum_serial_kernel(float* out, const T* in, Strided kept, Strided reduced,
                                  std::int64_t outputs, std::int64_t count) {
  for (std::int64_t o = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < outputs;
       o += std::int64_t(gridDim.x) * blockDim.x) {
    const T* base = in + offset_of(kept, o);
    float acc = 0.0f;
    for (std::int64_t r = 0; r < count; ++r) acc += load_f32(base + offset_of(reduced, r));
    out[o] = acc;
  }
}

// Chunked: block (o, c) sums chunk c of output o with a fixed-order block
// reduction into partial[o * chunks + c].
constexpr std::int64_t kChunk = 8192;
template <typename T>
__global__ void sum_chunk_kernel(float* partial, const T* in, Strided kept, Strided reduced,
                                 std::int64_t count, std::int64_t chunks) {
  __shared__ float scratch[32];
  const std::int64_t o = blockIdx.y;
  const std::int64_t c = blockIdx.x;
  const T* base = in + offset_of(kept, o);
  const std::int64_t r0 = c * kChunk, r1 = min(count, r0 + kChunk);
  float acc = 0.0f;
  for (std::int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x) acc += load_f32(base + offset_of(reduced, r));
  acc = detail::block_sum(acc, scratch);
  if (threadIdx.x == 0) partial[o * chunks + c] = acc;
}

__global__ void sum_partials_kernel(float* out, const float* partial, std::int64_t outputs,
                                    std::int64_t chunks) {
  for (std::int64_t o = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < outputs;
       o += std::int64_t(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    for (std::int64_t c = 0; c < chunks; ++c) acc += partial[o * chunks + c];
    out[o] = acc;
  }
}

bool use_chunks(std::int64_t outputs, std::int64_t count) { return count > 4 * kChunk && outputs < 4096; }

}  // namespace

std::int64_t sum_reduced_workspace(const Strided& kept, const Strided& reduced) {
  const std::int64_t outputs = kept.numel(), count = reduced.numel();
  return use_chunks(outputs, count) ? outputs * ((count + kChunk - 1) / kChunk) : 0;
}

void add_into(void* dst, DType dst_dtype, const Strided& dst_l, const void* src, DType src_dtype,
              const Strided& src_l, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  const std::int64_t n = dst_l.numel();
  if (n == 0) return;
  const int threads = 256;
  detail::dispatch_floating(dst_dtype, "gradient accumulation", [&](auto d) {
    using D = decltype(d);
    detail::dispatch_floating(src_dtype, "gradient accumulation", [&](auto s) {
      using S = decltype(s);
      const unsigned blocks = detail::blocks_for(n, threads);
      if (dst_l.contiguous() && src_l.contiguous())
        add_into_dense_kernel<D, S><<<blocks, threads, 0, detail::as_stream(stream)>>>(
            static_cast<D*>(dst), static_cast<const S*>(src), n);
      else
        add_into_kernel<D, S><<<blocks, threads, 0, detail::as_stream(stream)>>>(
            static_cast<D*>(dst), dst_l, static_cast<const S*>(src), src_l, n);
    });
  });
  detail::check_launch("add_into");
}

void sum_reduced(float* out, const void* in, DType in_dtype, const Strided& kept,
                 const Strided& reduced, float* workspace, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  const std::int64_t outputs = kept.numel(), count = reduced.numel();
  if (outputs == 0) return;
  const cudaStream_t st = detail::as_stream(stream);
  // Few outputs over long reductions would leave the GPU idle: chunk them.
  const bool chunked = use_chunks(outputs, count);
  detail::dispatch_floating(in_dtype, "sum", [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(in);
    if (!chunked) {
      const int threads = 128;
      sum_serial_kernel<T><<<detail::blocks_for(outputs, threads), threads, 0, st>>>(out, p, kept, reduced,
                                                                                     outputs, count);
      return;
    }
    const std::int64_t chunks = (count + kChunk - 1) / kChunk;
    float* partial = workspace;
    sum_chunk_kernel<T><<<dim3(unsigned(chunks), unsigned(outputs)), 256, 0, st>>>(partial, p, kept, reduced,
                                                                                  count, chunks);
    sum_partials_kernel<<<detail::blocks_for(outputs, 128), 128, 0, st>>>(out, partial, outputs, chunks);
  });
  detail::check_launch("sum_reduced");
}

}  // namespace remat::cuda
