// Dropout: thread t of the grid-stride loop computes Philox block b (four
// words) and the four elements 4b .. 4b + 3 it masks, loading and storing
// them as one 4-element vector when x and out are dense and aligned.
#include "cuda/dropout.h"

#include "cuda/kernel_util.cuh"
#include "engine/meta_mirror.h"
#include "engine/philox.h"

namespace remat::cuda {

namespace {

using detail::from_f32;
using detail::load_f32;
using detail::offset_of;

template <typename T>
struct alignas(4 * sizeof(T)) Quad {
  T v[4];
};

template <typename T>
__device__ __forceinline__ T masked(std::uint32_t word, std::uint32_t threshold, float x, float scale) {
  return from_f32<T>((word >> 8) >= threshold ? __fmul_rn(x, scale) : 0.0f);
}

// `dense`: x is dense (offset = index); `quads`: also x and out aligned to
// 4 elements, so whole blocks move as one vector.
template <typename T>
__global__ void dropout_kernel(T* out, const T* x, Strided x_l, std::int64_t n, bool dense,
                               bool quads, std::uint64_t seed, std::uint64_t offset,
                               std::uint32_t threshold, float scale) {
  const std::int64_t blocks = (n + 3) / 4;
  for (std::int64_t b = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks;
       b += std::int64_t(gridDim.x) * blockDim.x) {
    const philox::Words w = philox::block(seed, offset + std::uint64_t(b));
    const std::int64_t first = b * 4;
    if (quads && first + 4 <= n) {
      const Quad<T> in = reinterpret_cast<const Quad<T>*>(x)[b];
      Quad<T> o;
#pragma unroll
      for (int j = 0; j < 4; ++j) o.v[j] = masked<T>(w.v[j], threshold, load_f32<T>(&in.v[j]), scale);
      reinterpret_cast<Quad<T>*>(out)[b] = o;
      continue;
    }
    for (int j = 0; j < 4 && first + j < n; ++j) {
      const std::int64_t i = first + j;
      const float v = load_f32<T>(x + (dense ? i : offset_of(x_l, i)));
      out[i] = masked<T>(w.v[j], threshold, v, scale);
    }
  }
}

}  // namespace

void dropout(void* out, const void* x, const Strided& x_l, DType dtype, std::uint64_t seed,
             std::uint64_t offset, std::uint32_t threshold, float scale, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  const std::int64_t n = x_l.numel();
  if (n == 0) return;
  detail::dispatch_floating(dtype, "cuda::dropout", [&](auto tag) {
    using T = decltype(tag);
    const bool dense = x_l.contiguous();
    const auto align = [](const void* p) {
      return reinterpret_cast<std::uintptr_t>(p) % (4 * sizeof(T)) == 0;
    };
    const bool quads = dense && align(x) && align(out);
    const int threads = 256;
    dropout_kernel<T><<<detail::blocks_for((n + 3) / 4, threads), threads, 0,
                        detail::as_stream(stream)>>>(static_cast<T*>(out), static_cast<const T*>(x),
                                                     x_l, n, dense, quads, seed, offset, threshold,
                                                     scale);
  });
  detail::check_launch("cuda::dropout");
}

}  // namespace remat::cuda
