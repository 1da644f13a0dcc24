// Rotary embedding: the table kernel evaluates one (position, pair) per
// thread in double; the rotation moves 16-byte packs of each half-row (and
// the matching table entries) when the rows' inner dim is dense and aligned,
// else one pair per thread through the strides.
#include "cuda/rotary.h"

#include <string>

#include "cuda/elementwise.cuh"
#include "engine/meta_mirror.h"

namespace remat::cuda {

namespace {

using detail::from_f32;
using detail::kPack;
using detail::load_f32;
using detail::offset_of;
using detail::Pack;

__global__ void table_kernel(float* cos_out, float* sin_out, std::int64_t seq, std::int64_t half,
                             double theta, std::int64_t position_offset, float sign) {
  const std::int64_t n = seq * half;
  const double d = double(2 * half);
  for (std::int64_t t = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < n;
       t += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t s = t / half, i = t % half;
    const double inv_freq = pow(theta, -2.0 * double(i) / d);
    const double angle = double(position_offset + s) * inv_freq;
    cos_out[t] = __double2float_rn(cos(angle));
    sin_out[t] = __fmul_rn(sign, __double2float_rn(sin(angle)));
  }
}

// x1 c - x2 s and x2 c + x1 s, each product rounded (the CPU's order).
__device__ __forceinline__ void rotate(float x1, float x2, float c, float s, float& o1, float& o2) {
  o1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
  o2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

// One thread per pack of P pairs: row r = v / groups, pairs i0 .. i0 + P - 1.
// rows_l maps a row index to its first element; the inner dim has stride 1.
template <typename T>
__global__ void rotary_packed_kernel(T* out, const T* x, Strided rows_l, std::int64_t rows,
                                     std::int64_t seq, std::int64_t half, const float* cos_t,
                                     const float* sin_t) {
  constexpr int P = kPack<T>;
  const std::int64_t groups = half / P;
  const std::int64_t total = rows * groups;
  for (std::int64_t v = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < total;
       v += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t r = v / groups, i0 = (v % groups) * P;
    const T* xr = x + offset_of(rows_l, r);
    const Pack<T> a = *reinterpret_cast<const Pack<T>*>(xr + i0);
    const Pack<T> b = *reinterpret_cast<const Pack<T>*>(xr + half + i0);
    const std::int64_t t = (r % seq) * half + i0;
    float c[P], s[P];
#pragma unroll
    for (int q = 0; q < P / 4; ++q) {
      const float4 cq = reinterpret_cast<const float4*>(cos_t + t)[q];
      const float4 sq = reinterpret_cast<const float4*>(sin_t + t)[q];
      const float cv[4] = {cq.x, cq.y, cq.z, cq.w}, sv[4] = {sq.x, sq.y, sq.z, sq.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        c[4 * q + j] = cv[j];
        s[4 * q + j] = sv[j];
      }
    }
    Pack<T> o1, o2;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      float r1, r2;
      rotate(detail::to_f32(a.v[j]), detail::to_f32(b.v[j]), c[j], s[j], r1, r2);
      o1.v[j] = from_f32<T>(r1);
      o2.v[j] = from_f32<T>(r2);
    }
    T* orow = out + r * 2 * half;
    *reinterpret_cast<Pack<T>*>(orow + i0) = o1;
    *reinterpret_cast<Pack<T>*>(orow + half + i0) = o2;
  }
}

// One thread per pair (r, i); element j of row r sits at rows_l(r) + j * inner.
template <typename T>
__global__ void rotary_strided_kernel(T* out, const T* x, Strided rows_l, std::int64_t inner,
                                      std::int64_t rows, std::int64_t seq, std::int64_t half,
                                      const float* cos_t, const float* sin_t) {
  const std::int64_t total = rows * half;
  for (std::int64_t v = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < total;
       v += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t r = v / half, i = v % half;
    const T* xr = x + offset_of(rows_l, r);
    const std::int64_t t = (r % seq) * half + i;
    float o1, o2;
    rotate(load_f32<T>(xr + i * inner), load_f32<T>(xr + (half + i) * inner), cos_t[t], sin_t[t],
           o1, o2);
    T* orow = out + r * 2 * half;
    orow[i] = from_f32<T>(o1);
    orow[half + i] = from_f32<T>(o2);
  }
}

}  // namespace

void rotary_table(float* cos_out, float* sin_out, std::int64_t seq, std::int64_t half,
                  double theta, std::int64_t position_offset, float sign, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  const std::int64_t n = seq * half;
  if (n <= 0) return;
  const int threads = 256;
  table_kernel<<<detail::blocks_for(n, threads), threads, 0, detail::as_stream(stream)>>>(
      cos_out, sin_out, seq, half, theta, position_offset, sign);
  detail::check_launch("cuda::rotary_table");
}

void rotary(void* out, const void* x, const Strided& x_l, DType dtype, const float* cos_table,
            const float* sin_table, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  const char* what = "cuda::rotary";
  if (x_l.dim < 2 || x_l.sizes[x_l.dim - 1] % 2 != 0)
    throw ShapeError(std::string(what) + ": x must be [..., S, D] with D even");
  const std::int64_t n = x_l.numel();
  if (n == 0) return;
  const std::int64_t seq = x_l.sizes[x_l.dim - 2], half = x_l.sizes[x_l.dim - 1] / 2;
  const std::int64_t rows = n / (2 * half);
  const std::int64_t inner = x_l.strides[x_l.dim - 1];
  // Rows: the layout of x without its last dim, coalesced.
  Strided rows_l = x_l;
  rows_l.sizes[x_l.dim - 1] = 0;
  rows_l.strides[x_l.dim - 1] = 0;
  rows_l.dim = x_l.dim - 1;
  detail::coalesce(&rows_l, 1);
  const int threads = 256;
  const cudaStream_t s = detail::as_stream(stream);
  detail::dispatch_floating(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    constexpr int P = kPack<T>;
    bool packed = inner == 1 && half % P == 0 && detail::aligned16(x) && detail::aligned16(out) &&
                  detail::aligned16(cos_table) && detail::aligned16(sin_table);
    for (int d = 0; packed && d < rows_l.dim; ++d) packed = rows_l.strides[d] % P == 0;
    if (packed)
      rotary_packed_kernel<T><<<detail::blocks_for(rows * (half / P), threads), threads, 0, s>>>(
          static_cast<T*>(out), static_cast<const T*>(x), rows_l, rows, seq, half, cos_table,
          sin_table);
    else
      rotary_strided_kernel<T><<<detail::blocks_for(rows * half, threads), threads, 0, s>>>(
          static_cast<T*>(out), static_cast<const T*>(x), rows_l, inner, rows, seq, half,
          cos_table, sin_table);
  });
  detail::check_launch(what);
}

}  // namespace remat::cuda
