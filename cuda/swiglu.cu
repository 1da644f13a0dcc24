// SwiGLU: the forward is a two-input map (elementwise.cuh); the backward
// writes both gradients in one pass over dense operands, 16-byte packs when
// every pointer is aligned.
#include "cuda/swiglu.h"

#include <string>

#include "cuda/elementwise.cuh"
#include "engine/meta_mirror.h"

namespace remat::cuda {

namespace {

using detail::from_f32;
using detail::kPack;
using detail::load_f32;
using detail::Pack;

struct SwigluF {
  __device__ float operator()(float g, float u) const {
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
  }
};

// One element's gradients (the CPU's order: ((d u) s) (1 + g (1 - s)) and d (g s)).
__device__ __forceinline__ void swiglu_grads(float d, float g, float u, float& dg, float& du) {
  const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g)));
  dg = __fmul_rn(__fmul_rn(__fmul_rn(d, u), s), __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, s))));
  du = __fmul_rn(d, __fmul_rn(g, s));
}

template <typename T>
__device__ __forceinline__ void backward_one(T* dgate, T* dup, const T* dy, const T* gate,
                                             const T* up, std::int64_t i) {
  float dg, du;
  swiglu_grads(load_f32<T>(dy + i), load_f32<T>(gate + i), dgate ? load_f32<T>(up + i) : 0.0f, dg,
               du);
  if (dgate) dgate[i] = from_f32<T>(dg);
  if (dup) dup[i] = from_f32<T>(du);
}

// `packed`: every pointer 16-byte aligned, so packs of kPack<T> elements go
// first and the n % kPack<T> tail one by one; else element by element.
template <typename T>
__global__ void swiglu_backward_kernel(T* dgate, T* dup, const T* dy, const T* gate, const T* up,
                                       std::int64_t n, bool packed) {
  constexpr int P = kPack<T>;
  const std::int64_t tid = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t step = std::int64_t(gridDim.x) * blockDim.x;
  if (!packed) {
    for (std::int64_t i = tid; i < n; i += step) backward_one(dgate, dup, dy, gate, up, i);
    return;
  }
  const std::int64_t packs = n / P;
  for (std::int64_t v = tid; v < packs; v += step) {
    const Pack<T> d = reinterpret_cast<const Pack<T>*>(dy)[v];
    const Pack<T> g = reinterpret_cast<const Pack<T>*>(gate)[v];
    Pack<T> u{};
    if (dgate) u = reinterpret_cast<const Pack<T>*>(up)[v];
    Pack<T> og, ou;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      float dg, du;
      swiglu_grads(detail::to_f32(d.v[j]), detail::to_f32(g.v[j]),
                   dgate ? detail::to_f32(u.v[j]) : 0.0f, dg, du);
      og.v[j] = from_f32<T>(dg);
      ou.v[j] = from_f32<T>(du);
    }
    if (dgate) reinterpret_cast<Pack<T>*>(dgate)[v] = og;
    if (dup) reinterpret_cast<Pack<T>*>(dup)[v] = ou;
  }
  const std::int64_t i = packs * P + tid;
  if (i < n) backward_one(dgate, dup, dy, gate, up, i);
}

}  // namespace

void swiglu_forward(void* out, const void* gate, const Strided& gate_l, const void* up,
                    const Strided& up_l, DType dtype, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  const char* what = "cuda::swiglu_forward";
  bool same = gate_l.dim == up_l.dim;
  for (int d = 0; same && d < gate_l.dim; ++d) same = gate_l.sizes[d] == up_l.sizes[d];
  if (!same) throw ShapeError(std::string(what) + ": gate and up layouts have different sizes");
  detail::dispatch_floating(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    const T* in[2] = {static_cast<const T*>(gate), static_cast<const T*>(up)};
    const Strided ls[2] = {gate_l, up_l};
    detail::launch_map<T, 2>(what, static_cast<T*>(out), contiguous_layout(gate_l.sizes, gate_l.dim),
                             in, ls, SwigluF{}, stream);
  });
}

void swiglu_backward(void* dgate, void* dup, const void* dy, const void* gate, const void* up,
                     std::int64_t n, DType dtype, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  const char* what = "cuda::swiglu_backward";
  if (n <= 0 || (!dgate && !dup)) return;
  if (dgate && !up) throw Error(std::string(what) + ": dgate needs up");
  detail::dispatch_floating(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    using detail::aligned16;
    const bool packed = aligned16(dy) && aligned16(gate) && (!dgate || (aligned16(dgate) && aligned16(up))) &&
                        (!dup || aligned16(dup));
    const int threads = 256;
    const std::int64_t items = packed ? n / kPack<T> : n;
    swiglu_backward_kernel<T><<<detail::blocks_for(items, threads), threads, 0, detail::as_stream(stream)>>>(
        static_cast<T*>(dgate), static_cast<T*>(dup), static_cast<const T*>(dy),
        static_cast<const T*>(gate), static_cast<const T*>(up), n, packed);
  });
  detail::check_launch(what);
}

}  // namespace remat::cuda
