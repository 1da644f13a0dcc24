#include "ops/norm.h"

#include <immintrin.h>

#include <cmath>
#include <type_traits>
#include <vector>

#include "ops/kernel_util.h"
#include "ops/op.h"

namespace remat {

using namespace ops_detail;

namespace {

// Deterministic sum of f(0) .. f(n - 1): the lane scheme of lane_sum.
template <typename F>
inline float lane_acc(std::int64_t n, F&& f) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += f(i + j);
  for (int j = 0; i < n; ++i, ++j) acc[j] += f(i);
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// Rows per block for parameter-gradient partial sums. Depends on d only, never
// on the thread count, so the partials and their in-order sum are fixed.
std::int64_t block_rows(std::int64_t d) {
  return std::max<std::int64_t>(32, (std::int64_t(1) << 16) / std::max<std::int64_t>(d, 1));
}

// out[j] = sum over blocks b (in order) of partial[b * d + j].
void sum_partials(const std::vector<float>& partial, std::int64_t blocks, std::int64_t d, float* out) {
  parallel_elementwise(d, [&](std::int64_t j0, std::int64_t j1) {
    for (std::int64_t j = j0; j < j1; ++j) out[j] = 0.0f;
    for (std::int64_t b = 0; b < blocks; ++b) {
      const float* p = partial.data() + b * d;
      for (std::int64_t j = j0; j < j1; ++j) out[j] += p[j];
    }
  });
}

// Rows of x [..., d] (the product of the leading dims).
std::int64_t num_rows(const Tensor& x) {
  return shape_numel(Shape(x.sizes().begin(), x.sizes().end() - 1));
}

// ---------------------------------------------------------------------------
// RMSNorm

// {y, rstd}: y = x * rstd * w in f32, rstd f32 [rows].
std::vector<Tensor> rms_forward_cpu(const Tensor& x, const Tensor& w, float eps) {
  const std::int64_t d = x.size(-1), rows = num_rows(x);
  Tensor xf = f32_contiguous(x), wf = f32_contiguous(w);
  Tensor y = empty(x.sizes(), DType::f32), rstd = empty({rows}, DType::f32);
  if (skip_compute(y)) return {y, rstd};
  const float* px = xf.data<float>();
  const float* pw = wf.data<float>();
  float* py = y.data<float>();
  float* pr = rstd.data<float>();
  const float inv_d = d > 0 ? 1.0f / float(d) : 0.0f;
  parallel_rows(rows, d, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* xr = px + r * d;
      float* yr = py + r * d;
      const float rs = 1.0f / std::sqrt(lane_dot(xr, xr, d) * inv_d + eps);
      pr[r] = rs;
      for (std::int64_t j = 0; j < d; ++j) yr[j] = (xr[j] * rs) * pw[j];
    }
  });
  return {y, rstd};
}

// dx = rstd * (g*w - x * rstd^2 * sum(g*w*x) / d); dw = sum over rows of g * x * rstd.
std::vector<Tensor> rms_backward_cpu(const Tensor& g, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                     bool need_dx, bool need_dw) {
  const std::int64_t d = x.size(-1), rows = num_rows(x);
  Tensor gf = f32_contiguous(g), xf = f32_contiguous(x), rf = f32_contiguous(rstd);
  Tensor wf = need_dx ? f32_contiguous(w) : Tensor();  // saved only when dx is needed
  Tensor dx = need_dx ? empty(x.sizes(), DType::f32) : Tensor();
  const bool meta = skip_compute(gf);
  const std::int64_t br = block_rows(d);
  const std::int64_t blocks = (rows + br - 1) / br;
  std::vector<float> partial(need_dw && !meta ? std::size_t(blocks * d) : 0, 0.0f);
  if (!meta) {
    const float* pg = gf.data<float>();
    const float* px = xf.data<float>();
    const float* pw = need_dx ? wf.data<float>() : nullptr;
    const float* pr = rf.data<float>();
    float* pdx = need_dx ? dx.data<float>() : nullptr;
    const float inv_d = d > 0 ? 1.0f / float(d) : 0.0f;
    parallel_for(0, blocks, 1, [&](std::int64_t b0, std::int64_t b1) {
      for (std::int64_t b = b0; b < b1; ++b) {
        float* part = need_dw ? partial.data() + b * d : nullptr;
        for (std::int64_t r = b * br; r < std::min(rows, (b + 1) * br); ++r) {
          const float* gr = pg + r * d;
          const float* xr = px + r * d;
          const float rs = pr[r];
          if (need_dx) {
            const float dot = lane_acc(d, [&](std::int64_t j) { return (gr[j] * pw[j]) * xr[j]; });
            const float c = rs * rs * dot * inv_d;
            float* o = pdx + r * d;
            for (std::int64_t j = 0; j < d; ++j) o[j] = rs * (gr[j] * pw[j] - xr[j] * c);
          }
          if (need_dw)
            for (std::int64_t j = 0; j < d; ++j) part[j] += gr[j] * (xr[j] * rs);
        }
      }
    });
  }
  Tensor dw;
  if (need_dw) {
    dw = empty({d}, DType::f32);
    if (!meta) sum_partials(partial, blocks, d, dw.data<float>());
  }
  return {dx, dw};
}

// ---------------------------------------------------------------------------
// Residual add + RMSNorm
//
// The CPU kernels read and write the tensors' own dtype T (f32, bf16, f16)
// and compute in f32 with the expressions, roundings and summation orders of
// add (ops/binary.cc) followed by rms_forward / rms_backward above: the bits
// are theirs, only the memory passes are merged. f32 and bf16 rows go through
// AVX2 (the build's baseline, .bazelrc): one 8-float vector is exactly the
// eight lanes of lane_dot / lane_acc, and each vector operation rounds as the
// scalar one does (no fma). f16 rows take the scalar loops.

// T's rounding of f (the identity for f32).
template <typename T>
inline T round_to(float f) {
  if constexpr (std::is_same_v<T, float>)
    return f;
  else
    return T(f);
}

// fn(T{}) for the storage type T of floating dtype dt.
template <typename Fn>
void with_float_type(DType dt, Fn&& fn) {
  switch (dt) {
    case DType::bf16: fn(bf16{}); return;
    case DType::f16: fn(f16{}); return;
    default: fn(float{}); return;
  }
}

// The lanes of lane_sum / lane_dot / lane_acc combined in their order.
inline float lanes_total(const float* a) {
  return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

// Rows of T with an AVX2 path.
template <typename T>
inline constexpr bool kVec8 = std::is_same_v<T, float> || std::is_same_v<T, bf16>;

// Eight T values as f32.
template <typename T>
inline __m256 load8(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm256_loadu_ps(p);
  } else {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
  }
}

// v rounded to T, as f32 (bf16: bf16::from_float lane by lane: nearest even,
// a NaN made quiet).
template <typename T>
inline __m256 round8(__m256 v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(hi, _mm256_set1_epi32(1)));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
    const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16));
  }
}

// Stores eight values already rounded to T (round8).
template <typename T>
inline void store8(T* p, __m256 v) {
  if constexpr (std::is_same_v<T, float>) {
    _mm256_storeu_ps(p, v);
  } else {
    // The high halves, packed within 128-bit lanes, then quadwords 0 and 2.
    const __m256i hi = _mm256_srli_epi32(_mm256_castps_si256(v), 16);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(hi, hi), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
}

// h = x + r rounded to T; returns the sum of the rounded values' squares in
// lane_dot's lanes and order.
template <typename T>
float add_row(T* h, const T* x, const T* r, std::int64_t d) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t j = 0;
  if constexpr (kVec8<T>) {
    __m256 a = _mm256_setzero_ps();
    for (; j + 8 <= d; j += 8) {
      const __m256 hv = round8<T>(_mm256_add_ps(load8(x + j), load8(r + j)));
      store8(h + j, hv);
      a = _mm256_add_ps(a, _mm256_mul_ps(hv, hv));
    }
    _mm256_storeu_ps(acc, a);
  } else {
    for (; j + 8 <= d; j += 8)
      for (int k = 0; k < 8; ++k) {
        const T hv = round_to<T>(float(x[j + k]) + float(r[j + k]));
        h[j + k] = hv;
        acc[k] += float(hv) * float(hv);
      }
  }
  for (int k = 0; j < d; ++j, ++k) {
    const T hv = round_to<T>(float(x[j]) + float(r[j]));
    h[j] = hv;
    acc[k] += float(hv) * float(hv);
  }
  return lanes_total(acc);
}

// y = (h * rs) * w rounded to T (rms_forward's expression).
template <typename T>
void scale_row(T* y, const T* h, float rs, const float* w, std::int64_t d) {
  std::int64_t j = 0;
  if constexpr (kVec8<T>) {
    const __m256 vrs = _mm256_set1_ps(rs);
    for (; j + 8 <= d; j += 8)
      store8(y + j, round8<T>(_mm256_mul_ps(_mm256_mul_ps(load8(h + j), vrs), _mm256_loadu_ps(w + j))));
  }
  for (; j < d; ++j) y[j] = round_to<T>((float(h[j]) * rs) * w[j]);
}

// sum over j of (gy * w) * h in lane_acc's lanes and order (rms_backward's dot).
template <typename T>
float grad_dot_row(const T* gy, const float* w, const T* h, std::int64_t d) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t j = 0;
  if constexpr (kVec8<T>) {
    __m256 a = _mm256_setzero_ps();
    for (; j + 8 <= d; j += 8)
      a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_mul_ps(load8(gy + j), _mm256_loadu_ps(w + j)), load8(h + j)));
    _mm256_storeu_ps(acc, a);
  } else {
    for (; j + 8 <= d; j += 8)
      for (int k = 0; k < 8; ++k) acc[k] += (float(gy[j + k]) * w[j + k]) * float(h[j + k]);
  }
  for (int k = 0; j < d; ++j, ++k) acc[k] += (float(gy[j]) * w[j]) * float(h[j]);
  return lanes_total(acc);
}

// o = T(gh + T(rs * (gy * w - h * c))) (rms_backward's dx, rounded, plus
// grad_h); with kPart also part += gy * (h * rs) (rms_backward's dw term).
template <typename T, bool kPart>
void dh_row(T* o, float* part, const T* gh, const T* gy, const T* h, const float* w, float rs, float c,
            std::int64_t d) {
  std::int64_t j = 0;
  if constexpr (kVec8<T>) {
    const __m256 vrs = _mm256_set1_ps(rs), vc = _mm256_set1_ps(c);
    for (; j + 8 <= d; j += 8) {
      const __m256 g = load8(gy + j), x = load8(h + j);
      const __m256 dn = round8<T>(
          _mm256_mul_ps(vrs, _mm256_sub_ps(_mm256_mul_ps(g, _mm256_loadu_ps(w + j)), _mm256_mul_ps(x, vc))));
      store8(o + j, round8<T>(_mm256_add_ps(load8(gh + j), dn)));
      if constexpr (kPart)
        _mm256_storeu_ps(part + j, _mm256_add_ps(_mm256_loadu_ps(part + j), _mm256_mul_ps(g, _mm256_mul_ps(x, vrs))));
    }
  }
  for (; j < d; ++j) {
    const float g = float(gy[j]), x = float(h[j]);
    const T dn = round_to<T>(rs * (g * w[j] - x * c));
    o[j] = round_to<T>(float(gh[j]) + float(dn));
    if constexpr (kPart) part[j] += g * (x * rs);
  }
}

// part += gy * (h * rs) (rms_backward's dw term).
template <typename T>
void dw_row(float* part, const T* gy, const T* h, float rs, std::int64_t d) {
  std::int64_t j = 0;
  if constexpr (kVec8<T>) {
    const __m256 vrs = _mm256_set1_ps(rs);
    for (; j + 8 <= d; j += 8)
      _mm256_storeu_ps(part + j, _mm256_add_ps(_mm256_loadu_ps(part + j),
                                               _mm256_mul_ps(load8(gy + j), _mm256_mul_ps(load8(h + j), vrs))));
  }
  for (; j < d; ++j) part[j] += float(gy[j]) * (float(h[j]) * rs);
}

// Per row: h = x + r, written while the squares of its rounded values
// accumulate; then rstd and y as rms_forward computes them from h.
template <typename T>
void add_rms_forward_rows(T* ph, T* py, float* pr, const T* px, const T* pres, const float* pw,
                          std::int64_t rows, std::int64_t d, float eps) {
  const float inv_d = d > 0 ? 1.0f / float(d) : 0.0f;
  parallel_rows(rows, d, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float ss = add_row(ph + r * d, px + r * d, pres + r * d, d);
      const float rs = 1.0f / std::sqrt(ss * inv_d + eps);
      pr[r] = rs;
      scale_row(py + r * d, ph + r * d, rs, pw, d);
    }
  });
}

// {h, y, rstd}: h and y in x's dtype, rstd f32 [rows].
std::vector<Tensor> add_rms_forward_cpu(const Tensor& x, const Tensor& res, const Tensor& w, float eps) {
  const DType dt = x.dtype();
  const std::int64_t d = x.size(-1), rows = num_rows(x);
  Tensor xc = contiguous_detached(x), rc = contiguous_detached(res), wf = f32_contiguous(w);
  Tensor h = empty(x.sizes(), dt), y = empty(x.sizes(), dt), rstd = empty({rows}, DType::f32);
  if (skip_compute(h)) return {h, y, rstd};
  with_float_type(dt, [&](auto tag) {
    using T = decltype(tag);
    add_rms_forward_rows<T>(h.data<T>(), y.data<T>(), rstd.data<float>(), xc.data<T>(), rc.data<T>(),
                            wf.data<float>(), rows, d, eps);
  });
  return {h, y, rstd};
}

// Per row of a block of block_rows(d) rows: dn = rms_backward's dx of
// (grad_y, h) rounded to T, then dh = T(grad_h + dn) in f32, when pdh is
// non-null; the weight gradient's partial sums (rms_backward's expression
// and order) into partial + b * d when partial is non-null.
//
// dn is rounded to T before the add because the unfused graph does so:
// rms_norm returns its dx in the dtype and the engine adds it to h's other
// gradient in f32 (detail::add_into). So dh has the unfused bits when h has
// one other consumer (a + b == b + a), as in a decoder block. With several,
// the engine sums h's gradients in arrival order with dn at some place in
// that chain, while here dn comes last: only the order of that final add
// differs. When nothing else reaches h, grad_h is the engine's zeros and
// 0 + dn turns a -0 of dn into +0 (equal values).
template <typename T>
void add_rms_backward_rows(T* pdh, float* partial, const T* pgh, const T* pgy, const T* ph,
                           const float* pw, const float* pr, std::int64_t rows, std::int64_t d) {
  const std::int64_t br = block_rows(d);
  const std::int64_t blocks = (rows + br - 1) / br;
  const float inv_d = d > 0 ? 1.0f / float(d) : 0.0f;
  parallel_for(0, blocks, 1, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b) {
      float* part = partial ? partial + b * d : nullptr;
      for (std::int64_t r = b * br; r < std::min(rows, (b + 1) * br); ++r) {
        const T* gy = pgy + r * d;
        const T* hr = ph + r * d;
        const float rs = pr[r];
        if (pdh) {
          const float dot = grad_dot_row(gy, pw, hr, d);
          const float c = rs * rs * dot * inv_d;
          if (part)
            dh_row<T, true>(pdh + r * d, part, pgh + r * d, gy, hr, pw, rs, c, d);
          else
            dh_row<T, false>(pdh + r * d, nullptr, pgh + r * d, gy, hr, pw, rs, c, d);
        } else if (part) {
          dw_row(part, gy, hr, rs, d);
        }
      }
    }
  });
}

// {dh, dw}: dh (the gradient of x and of residual) when need_dh, dw when
// need_dw. w is needed (defined) only for dh. Gradients in a dtype other than
// h's are staged in f32 and dh is rounded once at the end.
std::vector<Tensor> add_rms_backward_cpu(const Tensor& gh, const Tensor& gy, const Tensor& h, const Tensor& w,
                                         const Tensor& rstd, bool need_dh, bool need_dw) {
  const DType dt = h.dtype();
  const std::int64_t d = h.size(-1), rows = num_rows(h);
  const bool same = gy.dtype() == dt && (!need_dh || gh.dtype() == dt);
  const DType kt = same ? dt : DType::f32;  // the kernel's storage type
  auto stage = [&](const Tensor& t) { return same ? contiguous_detached(t) : f32_contiguous(t); };
  Tensor gyc = stage(gy), hc = stage(h);
  Tensor ghc = need_dh ? stage(gh) : Tensor();
  Tensor wf = need_dh ? f32_contiguous(w) : Tensor();
  Tensor rf = f32_contiguous(rstd);
  Tensor dh = need_dh ? empty(h.sizes(), kt) : Tensor();
  const bool meta = skip_compute(hc);
  const std::int64_t blocks = (rows + block_rows(d) - 1) / block_rows(d);
  std::vector<float> partial(need_dw && !meta ? std::size_t(blocks * d) : 0, 0.0f);
  if (!meta) {
    with_float_type(kt, [&](auto tag) {
      using T = decltype(tag);
      add_rms_backward_rows<T>(need_dh ? dh.data<T>() : nullptr, need_dw ? partial.data() : nullptr,
                               need_dh ? ghc.data<T>() : nullptr, gyc.data<T>(), hc.data<T>(),
                               need_dh ? wf.data<float>() : nullptr, rf.data<float>(), rows, d);
    });
  }
  Tensor dw;
  if (need_dw) {
    dw = empty({d}, DType::f32);
    if (!meta) sum_partials(partial, blocks, d, dw.data<float>());
    dw = dw.to(dt);
  }
  if (need_dh && kt != dt) dh = dh.to(dt);
  return {dh, dw};
}

// ---------------------------------------------------------------------------
// LayerNorm

// {y, mean, rstd}: y in f32, mean and rstd f32 [rows]; w and b may be undefined.
std::vector<Tensor> ln_forward_cpu(const Tensor& x, const Tensor& w, const Tensor& b, float eps) {
  const std::int64_t d = x.size(-1), rows = num_rows(x);
  Tensor xf = f32_contiguous(x);
  Tensor wf = w.defined() ? f32_contiguous(w) : Tensor();
  Tensor bf = b.defined() ? f32_contiguous(b) : Tensor();
  Tensor y = empty(x.sizes(), DType::f32), mean = empty({rows}, DType::f32), rstd = empty({rows}, DType::f32);
  if (skip_compute(y)) return {y, mean, rstd};
  const float* px = xf.data<float>();
  const float* pw = w.defined() ? wf.data<float>() : nullptr;
  const float* pb = b.defined() ? bf.data<float>() : nullptr;
  float* py = y.data<float>();
  float* pm = mean.data<float>();
  float* pr = rstd.data<float>();
  const float inv_d = d > 0 ? 1.0f / float(d) : 0.0f;
  parallel_rows(rows, d, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* xr = px + r * d;
      float* yr = py + r * d;
      const float m = lane_sum(xr, d) * inv_d;
      const float var = lane_acc(d, [&](std::int64_t j) { return (xr[j] - m) * (xr[j] - m); }) * inv_d;
      const float rs = 1.0f / std::sqrt(var + eps);
      pm[r] = m;
      pr[r] = rs;
      if (pw && pb) {
        for (std::int64_t j = 0; j < d; ++j) yr[j] = ((xr[j] - m) * rs) * pw[j] + pb[j];
      } else if (pw) {
        for (std::int64_t j = 0; j < d; ++j) yr[j] = ((xr[j] - m) * rs) * pw[j];
      } else if (pb) {
        for (std::int64_t j = 0; j < d; ++j) yr[j] = ((xr[j] - m) * rs) + pb[j];
      } else {
        for (std::int64_t j = 0; j < d; ++j) yr[j] = (xr[j] - m) * rs;
      }
    }
  });
  return {y, mean, rstd};
}

// With xhat = (x - mean) * rstd and gw = g * w (g without weight):
// dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)); dw = sum g * xhat; db = sum g.
// x, mean and rstd are undefined when only db is needed; w when dx is not needed.
std::vector<Tensor> ln_backward_cpu(const Tensor& g, const Tensor& x, const Tensor& w, const Tensor& mean,
                                    const Tensor& rstd, DType, bool need_dx, bool need_dw, bool need_db) {
  const std::int64_t d = g.size(-1), rows = num_rows(g);
  const bool need_x = need_dx || need_dw;
  Tensor gf = f32_contiguous(g);
  Tensor xf = need_x ? f32_contiguous(x) : Tensor();
  Tensor wf = need_dx && w.defined() ? f32_contiguous(w) : Tensor();
  Tensor mf = need_x ? f32_contiguous(mean) : Tensor();
  Tensor rf = need_x ? f32_contiguous(rstd) : Tensor();
  Tensor dx = need_dx ? empty(g.sizes(), DType::f32) : Tensor();
  const bool meta = skip_compute(gf);
  const std::int64_t br = block_rows(d);
  const std::int64_t blocks = (rows + br - 1) / br;
  std::vector<float> part_w(need_dw && !meta ? std::size_t(blocks * d) : 0, 0.0f);
  std::vector<float> part_b(need_db && !meta ? std::size_t(blocks * d) : 0, 0.0f);
  if (!meta) {
    const float* pg = gf.data<float>();
    const float* px = need_x ? xf.data<float>() : nullptr;
    const float* pw = wf.defined() ? wf.data<float>() : nullptr;
    const float* pm = need_x ? mf.data<float>() : nullptr;
    const float* pr = need_x ? rf.data<float>() : nullptr;
    float* pdx = need_dx ? dx.data<float>() : nullptr;
    const float inv_d = d > 0 ? 1.0f / float(d) : 0.0f;
    parallel_for(0, blocks, 1, [&](std::int64_t b0, std::int64_t b1) {
      for (std::int64_t b = b0; b < b1; ++b) {
        float* pwp = need_dw ? part_w.data() + b * d : nullptr;
        float* pbp = need_db ? part_b.data() + b * d : nullptr;
        for (std::int64_t r = b * br; r < std::min(rows, (b + 1) * br); ++r) {
          const float* gr = pg + r * d;
          const float* xr = need_x ? px + r * d : nullptr;
          const float m = need_x ? pm[r] : 0.0f, rs = need_x ? pr[r] : 0.0f;
          if (need_dx) {
            float* o = pdx + r * d;
            float s1, s2;
            if (pw) {
              s1 = lane_acc(d, [&](std::int64_t j) { return gr[j] * pw[j]; });
              s2 = lane_acc(d, [&](std::int64_t j) { return (gr[j] * pw[j]) * ((xr[j] - m) * rs); });
            } else {
              s1 = lane_sum(gr, d);
              s2 = lane_acc(d, [&](std::int64_t j) { return gr[j] * ((xr[j] - m) * rs); });
            }
            const float a = s1 * inv_d, c = s2 * inv_d;
            if (pw) {
              for (std::int64_t j = 0; j < d; ++j)
                o[j] = rs * ((gr[j] * pw[j] - a) - ((xr[j] - m) * rs) * c);
            } else {
              for (std::int64_t j = 0; j < d; ++j) o[j] = rs * ((gr[j] - a) - ((xr[j] - m) * rs) * c);
            }
          }
          if (need_dw)
            for (std::int64_t j = 0; j < d; ++j) pwp[j] += gr[j] * ((xr[j] - m) * rs);
          if (need_db)
            for (std::int64_t j = 0; j < d; ++j) pbp[j] += gr[j];
        }
      }
    });
  }
  Tensor dw, db;
  if (need_dw) {
    dw = empty({d}, DType::f32);
    if (!meta) sum_partials(part_w, blocks, d, dw.data<float>());
  }
  if (need_db) {
    db = empty({d}, DType::f32);
    if (!meta) sum_partials(part_b, blocks, d, db.data<float>());
  }
  return {dx, dw, db};
}

const KernelRegistration<NormKernels> kCpu(norm_kernels(), DeviceType::CPU,
                                           {rms_forward_cpu, rms_backward_cpu, ln_forward_cpu, ln_backward_cpu},
                                           KernelDTypes::f32);
// The fused residual add reads and writes the tensors' own dtype (above).
const KernelRegistration<AddRmsNormKernels> kCpuAdd(add_rms_norm_kernels(), DeviceType::CPU,
                                                    {add_rms_forward_cpu, add_rms_backward_cpu},
                                                    KernelDTypes::native);

// ---------------------------------------------------------------------------
// The ops

struct NormState {
  float eps;
};

void check_param(const char* op, const Tensor& x, const Tensor& p, const char* what) {
  check_floating(op, p, what);
  REMAT_CHECK(p.dtype() == x.dtype(), DTypeError, op, ": ", what, " ", describe(p),
              " must have the input's dtype (input ", describe(x), ")");
  REMAT_CHECK(p.device() == x.device(), DeviceError, op, ": ", what, " ", describe(p), " and input ", describe(x),
              " are on different devices");
  REMAT_CHECK(p.dim() == 1 && p.size(0) == x.size(-1), ShapeError, op, ": ", what, " must be [", x.size(-1),
              "] (the input's last dim), got ", describe(p), " for input ", describe(x));
}

void check_input(const char* op, const Tensor& x) {
  check_floating(op, x, "input");
  REMAT_CHECK(x.dim() >= 1, ShapeError, op, ": input must have at least 1 dim (normalised over ",
              "the last), got ", describe(x));
}

// Per element: a multiply-add for the statistics, two multiplies for the output.
OpCost norm_cost(const std::vector<Tensor>& in, const NormState&) {
  const double n = double(in[0].numel());
  return {0, 4 * n, 2 * n * double(element_size(in[0].dtype()))};
}

// RMSNorm

void check_rms(const OpDef& op, const std::vector<Tensor>& in, const NormState&) {
  check_input(op.name(), in[0]);
  check_param(op.name(), in[0], in[1], "weight");
}

OpResults rms_forward(const std::vector<Tensor>& in, NormState& s) {
  std::vector<Tensor> f = norm_kernels().run(in[0].device(), &NormKernels::rms_forward, in[0], in[1], s.eps);
  return {{f[0]}, {f[1]}};
}

std::vector<Tensor> rms_backward(const OpBackward<NormState>& b) {
  return norm_kernels().run(b.grad().device(), &NormKernels::rms_backward, b.grad(), b.saved("x"),
                            b.saved("weight"), b.saved("rstd"), b.needs(0), b.needs(1));
}

const Op<NormState> kRmsNorm({.name = "rms_norm",
                              .inputs = {"x", "weight"},
                              .outputs = {{"y"}},
                              .saves = {{"x", SaveFrom::input, 0},
                                        {"weight", SaveFrom::input, 1, inputs_mask({0})},  // only dx needs it
                                        {"rstd", SaveFrom::intermediate, 0}},
                              .summary = "x * rsqrt(mean(x^2) + eps) * weight over the last dim"},
                             {.check = check_rms, .forward = rms_forward, .backward = rms_backward,
                              .cost = norm_cost},
                             &norm_kernels());

// The residual add and RMSNorm, fused

void check_add_rms(const OpDef& op, const std::vector<Tensor>& in, const NormState&) {
  const Tensor &x = in[0], &residual = in[1];
  check_floating(op.name(), x, "x");
  REMAT_CHECK(x.dim() >= 1, ShapeError, op.name(),
              ": x must have at least 1 dim (normalised over the last), got ", describe(x));
  check_defined(op.name(), residual, "residual");
  REMAT_CHECK(residual.dtype() == x.dtype(), DTypeError, op.name(), ": residual ", describe(residual),
              " must have x's dtype (x ", describe(x), ")");
  REMAT_CHECK(residual.device() == x.device(), DeviceError, op.name(), ": residual ", describe(residual),
              " and x ", describe(x), " are on different devices");
  REMAT_CHECK(residual.sizes() == x.sizes(), ShapeError, op.name(), ": residual ", describe(residual),
              " must have x's shape (x ", describe(x), "; h = x + residual does not broadcast)");
  check_param(op.name(), x, in[2], "weight");
}

OpResults add_rms_forward(const std::vector<Tensor>& in, NormState& s) {
  std::vector<Tensor> f =
      add_rms_norm_kernels().run(in[0].device(), &AddRmsNormKernels::forward, in[0], in[1], in[2], s.eps);
  return {{f[0], f[1]}, {f[2]}};
}

std::vector<Tensor> add_rms_backward(const OpBackward<NormState>& b) {
  const bool need_dh = b.needs(0) || b.needs(1);
  std::vector<Tensor> r = add_rms_norm_kernels().run(b.grad(0).device(), &AddRmsNormKernels::backward, b.grad(0),
                                                     b.grad(1), b.saved("h"), b.saved("weight"), b.saved("rstd"),
                                                     need_dh, b.needs(2));
  // x and residual get the same tensor, as add's backward hands them.
  return {b.needs(0) ? r[0] : Tensor(), b.needs(1) ? r[0] : Tensor(), r[1]};
}

// y is rms_norm(h, weight) bit for bit (norm_test checks it): dynamic
// rematerialization rebuilds y from a resident h instead of the add and the
// projection it came from. rms_norm reads h twice and writes y, against the
// fused call's five passes over a row (x, residual, h written, h, y).
std::vector<DerivedResult> add_rms_derive(const NormState& s) {
  return {{.result = 1,
           .from_results = {0},
           .from_inputs = {2},
           .fn = [eps = s.eps](const std::vector<Tensor>& hw) { return std::vector<Tensor>{kRmsNorm.call1(hw, {eps})}; },
           .op = "rms_norm",
           .cost_fraction = 0.6}};
}

// What rms_norm(h, weight) saves; add saves nothing.
const Op<NormState> kAddRmsNorm({.name = "add_rms_norm",
                                 .inputs = {"x", "residual", "weight"},
                                 .outputs = {{"h"}, {"y"}},
                                 .saves = {{"h", SaveFrom::output, 0},
                                           {"weight", SaveFrom::input, 2, inputs_mask({0, 1})},  // only dh needs it
                                           {"rstd", SaveFrom::intermediate, 0}},
                                 .summary = "h = x + residual and y = rms_norm(h, weight), fused"},
                                {.check = check_add_rms, .forward = add_rms_forward, .backward = add_rms_backward,
                                 .cost = norm_cost, .derive = add_rms_derive},
                                &add_rms_norm_kernels());

// LayerNorm

void check_ln(const OpDef& op, const std::vector<Tensor>& in, const NormState&) {
  check_input(op.name(), in[0]);
  if (in[1].defined()) check_param(op.name(), in[0], in[1], "weight");
  if (in[2].defined()) check_param(op.name(), in[0], in[2], "bias");
}

OpResults ln_forward(const std::vector<Tensor>& in, NormState& s) {
  std::vector<Tensor> f =
      norm_kernels().run(in[0].device(), &NormKernels::ln_forward, in[0], in[1], in[2], s.eps);
  return {{f[0]}, {f[1], f[2]}};
}

std::vector<Tensor> ln_backward(const OpBackward<NormState>& b) {
  return norm_kernels().run(b.grad().device(), &NormKernels::ln_backward, b.grad(), b.saved("x"),
                            b.saved("weight"), b.saved("mean"), b.saved("rstd"), b.input(0).dtype, b.needs(0),
                            b.needs(1), b.needs(2));
}

// db needs only the incoming gradient; dx and dw need x and the statistics.
const Op<NormState> kLayerNorm({.name = "layer_norm",
                                .inputs = {"x", "weight", "bias"},
                                .outputs = {{"y"}},
                                .saves = {{"x", SaveFrom::input, 0, inputs_mask({0, 1})},
                                          {"weight", SaveFrom::input, 1, inputs_mask({0})},  // only dx needs it
                                          {"mean", SaveFrom::intermediate, 0, inputs_mask({0, 1})},
                                          {"rstd", SaveFrom::intermediate, 1, inputs_mask({0, 1})}},
                                .summary = "(x - mean) * rsqrt(var + eps) * weight + bias over the last dim"},
                               {.check = check_ln, .forward = ln_forward, .backward = ln_backward,
                                .cost = norm_cost},
                               &norm_kernels());

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  return kRmsNorm.call1({x, weight}, {float(eps)});
}

AddRmsNorm add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps) {
  std::vector<Tensor> out = kAddRmsNorm({x, residual, weight}, {float(eps)});
  return AddRmsNorm{out[0], out[1]};
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  return kLayerNorm.call1({x, weight, bias}, {float(eps)});
}

KernelTable<NormKernels>& norm_kernels() {
  static KernelTable<NormKernels> t("rms_norm / layer_norm");
  return t;
}

KernelTable<AddRmsNormKernels>& add_rms_norm_kernels() {
  static KernelTable<AddRmsNormKernels> t("add_rms_norm");
  return t;
}

}  // namespace remat
