// Embedding kernels. The forward is a row gather (index.cu's row copy with
// 128-bit words). The backward gives each touched vocabulary row one block;
// its threads own 128-bit column packs (where d allows) and add the token
// rows listed for that id in list order, in f32 registers, then round once:
// no atomics, the same bits on every run and the CPU kernel's sums.
#include <cstdint>

#include "cuda/embedding.h"
#include "cuda/index.h"
#include "cuda/kernel_util.cuh"
#include "engine/meta_mirror.h"

namespace remat::cuda {

namespace {

using detail::from_f32;
using detail::load_f32;

// V consecutive elements loaded and stored as one word.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <typename T, int V>
__global__ void embedding_backward_kernel(T* __restrict__ grad, const T* __restrict__ g,
                                          const std::int64_t* __restrict__ rows,
                                          const std::int64_t* __restrict__ seg,
                                          const std::int64_t* __restrict__ order, std::int64_t touched,
                                          std::int64_t d) {
  using P = Pack<T, V>;
  const std::int64_t packs = d / V;
  for (std::int64_t t = blockIdx.x; t < touched; t += gridDim.x) {
    const std::int64_t begin = seg[t], end = seg[t + 1];
    P* dst = reinterpret_cast<P*>(grad + rows[t] * d);
    for (std::int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float acc[V];
#pragma unroll
      for (int v = 0; v < V; ++v) acc[v] = 0.0f;
      for (std::int64_t i = begin; i < end; ++i) {
        const P in = reinterpret_cast<const P*>(g + order[i] * d)[p];
#pragma unroll
        for (int v = 0; v < V; ++v) acc[v] += load_f32(&in.v[v]);
      }
      P res;
#pragma unroll
      for (int v = 0; v < V; ++v) res.v[v] = from_f32<T>(acc[v]);
      dst[p] = res;
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

void embedding_forward(void* out, const void* weight, DType dtype, const void* ids, DType id_dtype,
                       std::int64_t n, std::int64_t d, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  if (!is_floating(dtype))
    throw DTypeError(std::string("embedding: no CUDA kernel for dtype ") + dtype_name(dtype) +
                     " (expected f32, bf16 or f16)");
  // One outer block: out row t = weight row ids[t] (the table size is not needed).
  index_select_rows(out, weight, dtype, ids, id_dtype, 1, 1, 0, n, d, stream);
}

void embedding_backward(void* grad, const void* g, DType dtype, const std::int64_t* rows,
                        const std::int64_t* seg, const std::int64_t* order, std::int64_t touched,
                        std::int64_t d, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  if (touched <= 0 || d <= 0) return;
  const unsigned blocks = detail::blocks_for(touched, 1);
  detail::dispatch_floating(dtype, "embedding backward", [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = int(16 / sizeof(T));
    const bool vec = d % V == 0 && aligned16(grad) && aligned16(g);
    const std::int64_t packs = vec ? d / V : d;
    const int threads = packs >= 256 ? 256 : int((packs + 31) / 32 * 32);
    const cudaStream_t s = detail::as_stream(stream);
    if (vec)
      embedding_backward_kernel<T, V><<<blocks, threads, 0, s>>>(static_cast<T*>(grad), static_cast<const T*>(g),
                                                                 rows, seg, order, touched, d);
    else
      embedding_backward_kernel<T, 1><<<blocks, threads, 0, s>>>(static_cast<T*>(grad), static_cast<const T*>(g),
                                                                 rows, seg, order, touched, d);
  });
  detail::check_launch("embedding_backward");
}

}  // namespace remat::cuda
