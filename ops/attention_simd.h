// The CPU attention tiles of ops/attention.cc for one instruction set: the
// tile products, the online softmax of a score row, one query block of the
// forward and one (query block, key tile) block of the backward.
//
// Deliberately no include guard: ops/attention.cc includes this once per
// instruction set (see ops/vec_math.h for the macros it defines first), after
// its ForwardBlock, BackwardBlock, Kernels, kTileQ and kTileK.
//
// Determinism: every element of every tile product is one chain of fmas in
// increasing k, started from the stored value; the blocking over rows and
// columns (which differs between AVX2 and AVX-512) only chooses which chains
// run side by side. The k range of a chain (where causal masking trims zero
// terms) depends on the row's block of kRowBlock rows, the same on both
// paths. Row sums and maxima go through 16 lanes (one 512-bit vector or two
// 256-bit ones) reduced in a fixed tree. So both paths, every thread count
// and every schedule give the same bits.

#include "ops/vec_math.h"

// Rows of a product that share one k range.
constexpr std::int64_t kRowBlock = 8;
// Product rows per micro-kernel call, and vectors of columns per call for R
// rows: the accumulators plus one row of B stay in registers (32 zmm, 16 ymm).
constexpr int kMaxRows = kW == 16 ? 8 : 4;
constexpr int max_vectors(int rows) {
  if (kW == 16) return rows >= 8 ? 2 : 4;
  return rows >= 4 ? 2 : 4;
}
static_assert(kRowBlock % kMaxRows == 0, "micro-kernel rows tile a row block");
static_assert(kTileK % 16 == 0, "score rows are whole 16-lane groups");

// C[r][0, n) = (load_c ? C[r] : 0) + sum_{k in [k0, k1)} A(r, k) * B[k][0, n) for
// r < R, where A(r, k) = a[r * ars + k * aks], B has row stride ldb and C ldc;
// n = NV vectors, the last holding only the lanes of `tail` if kTail.
template <int R, int NV, bool kTail>
REMAT_SIMD_FN inline void micro(const float* a, std::int64_t ars, std::int64_t aks, const float* b,
                                std::int64_t ldb, float* c, std::int64_t ldc, std::int64_t k0,
                                std::int64_t k1, bool load_c, vmask tail) {
  vf acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const float* cp = c + r * ldc + v * kW;
      if (!load_c)
        acc[r][v] = vzero();
      else
        acc[r][v] = kTail && v == NV - 1 ? vload(cp, tail) : vload(cp);
    }
  const float* ap = a + k0 * aks;
  const float* bp = b + k0 * ldb;
  for (std::int64_t k = k0; k < k1; ++k, ap += aks, bp += ldb) {
    vf bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      bv[v] = kTail && v == NV - 1 ? vload(bp + v * kW, tail) : vload(bp + v * kW);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const vf x = vset1(ap[r * ars]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = vfma(x, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* cp = c + r * ldc + v * kW;
      if (kTail && v == NV - 1)
        vstore(cp, acc[r][v], tail);
      else
        vstore(cp, acc[r][v]);
    }
}

// micro<R, nv, tail> for a run-time nv <= NV.
template <int R, int NV>
REMAT_SIMD_FN inline void micro_last(int nv, bool tail, const float* a, std::int64_t ars,
                                     std::int64_t aks, const float* b, std::int64_t ldb, float* c,
                                     std::int64_t ldc, std::int64_t k0, std::int64_t k1,
                                     bool load_c, vmask m) {
  if constexpr (NV > 1) {
    if (nv < NV)
      return micro_last<R, NV - 1>(nv, tail, a, ars, aks, b, ldb, c, ldc, k0, k1, load_c, m);
  }
  if (tail)
    micro<R, NV, true>(a, ars, aks, b, ldb, c, ldc, k0, k1, load_c, m);
  else
    micro<R, NV, false>(a, ars, aks, b, ldb, c, ldc, k0, k1, load_c, m);
}

// Which part of a product causal masking leaves (the rest are zero terms or
// unused scores). With b the first row of a kRowBlock block:
//   k_upper: k < b + kRowBlock + off (query rows against keys, off = i0 - j0);
//   k_lower: k >= b + off (key rows against query rows, off = j0 - i0);
//   cols:    columns < b + kRowBlock + off (scores; off = i0 - j0).
enum class Trim { none, k_upper, k_lower, cols };

// C [m, n] (+)= A [m, k] B [k, n] as in micro, over blocks of kRowBlock rows.
struct Product {
  const float* a;
  std::int64_t ars, aks;
  const float* b;
  std::int64_t ldb;
  float* c;
  std::int64_t ldc;
  std::int64_t m, n, k;
  Trim trim;
  std::int64_t off;
  bool load_c;
};

template <int R>
REMAT_SIMD_FN inline void product_rows(const Product& p, std::int64_t r0, std::int64_t n,
                                       std::int64_t k0, std::int64_t k1) {
  constexpr int NV = max_vectors(R);
  const float* a = p.a + r0 * p.ars;
  float* c = p.c + r0 * p.ldc;
  std::int64_t j = 0;
  for (; j + NV * kW <= n; j += NV * kW)
    micro<R, NV, false>(a, p.ars, p.aks, p.b + j, p.ldb, c + j, p.ldc, k0, k1, p.load_c,
                        vfirst(kW));
  if (j < n) {
    const std::int64_t rest = n - j;
    const int nv = int((rest + kW - 1) / kW);
    const std::int64_t last = rest - std::int64_t(nv - 1) * kW;
    micro_last<R, NV>(nv, last < kW, a, p.ars, p.aks, p.b + j, p.ldb, c + j, p.ldc, k0, k1,
                      p.load_c, vfirst(last));
  }
}

REMAT_SIMD_FN inline void product(const Product& p) {
  for (std::int64_t b0 = 0; b0 < p.m; b0 += kRowBlock) {
    std::int64_t k0 = 0, k1 = p.k, n = p.n;
    if (p.trim == Trim::k_upper) k1 = std::clamp<std::int64_t>(b0 + kRowBlock + p.off, 0, p.k);
    if (p.trim == Trim::k_lower) k0 = std::clamp<std::int64_t>(b0 + p.off, 0, p.k);
    if (p.trim == Trim::cols) n = std::clamp<std::int64_t>(b0 + kRowBlock + p.off, 0, p.n);
    if (n <= 0 || (k0 >= k1 && p.load_c)) continue;
    const std::int64_t end = std::min(p.m, b0 + kRowBlock);
    std::int64_t r = b0;
    for (; r + kMaxRows <= end; r += kMaxRows) product_rows<kMaxRows>(p, r, n, k0, k1);
    if constexpr (kMaxRows > 4) {
      if (r + 4 <= end) {
        product_rows<4>(p, r, n, k0, k1);
        r += 4;
      }
    }
    if (r + 2 <= end) {
      product_rows<2>(p, r, n, k0, k1);
      r += 2;
    }
    if (r < end) product_rows<1>(p, r, n, k0, k1);
  }
}

// Vectors per 16-lane group, the unit of row sums and maxima.
constexpr int kG = 16 / kW;

// Lane mask of vector v of group g for a row whose first `lim` entries count.
REMAT_SIMD_FN inline vmask row_lanes(std::int64_t lim, std::int64_t g, int v) {
  return vfirst(std::clamp<std::int64_t>(lim - g * 16 - v * kW, 0, kW));
}

// One score row of the forward against a key tile: p[0, lim) holds the raw
// scores q.k of the keys that count (lim >= 1). Scales them, updates the row's
// running max m and sum l, and leaves p[c] = exp(score - m) for c < lim and 0
// up to kTileK. Returns the factor the row's accumulated output must be
// multiplied by (exp(m_old - m_new), 0 for the first tile).
REMAT_SIMD_FN inline float softmax_row(float* p, std::int64_t lim, float scale, float& m,
                                       float& l) {
  const std::int64_t groups = (lim + 15) / 16;
  const vf neg_inf = vset1(-__builtin_inff()), vs = vset1(scale);
  vf mx[kG];
#pragma GCC unroll 2
  for (int v = 0; v < kG; ++v) mx[v] = neg_inf;
  for (std::int64_t g = 0; g < groups; ++g)
#pragma GCC unroll 2
    for (int v = 0; v < kG; ++v) {
      float* pv = p + g * 16 + v * kW;
      const vf x = vselect(row_lanes(lim, g, v), vmul(vload(pv), vs), neg_inf);
      vstore(pv, x);
      mx[v] = vmax(mx[v], x);
    }
  const float m_old = m, m_new = std::max(m_old, vtree_max16(mx));
  const float alpha = m_old == -__builtin_inff() ? 0.0f : vexp1(m_old - m_new);
  const vf vm = vset1(m_new);
  vf sum[kG];
#pragma GCC unroll 2
  for (int v = 0; v < kG; ++v) sum[v] = vzero();
  for (std::int64_t g = 0; g < groups; ++g)
#pragma GCC unroll 2
    for (int v = 0; v < kG; ++v) {
      float* pv = p + g * 16 + v * kW;
      const vf e = vexp(vsub(vload(pv), vm));  // masked lanes: exp(-inf) = 0
      vstore(pv, e);
      sum[v] = vadd(sum[v], e);
    }
  for (std::int64_t c = groups * 16; c < kTileK; c += kW) vstore(p + c, vzero());
  l = l * alpha + vtree_sum16(sum);
  m = m_new;
  return alpha;
}

// x[0, n) = 0.
REMAT_SIMD_FN inline void zero_rows(float* x, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + kW <= n; i += kW) vstore(x + i, vzero());
  if (i < n) vstore(x + i, vzero(), vfirst(n - i));
}

// x[0, n) *= s.
REMAT_SIMD_FN inline void scale_row(float* x, std::int64_t n, float s) {
  const vf vs = vset1(s);
  std::int64_t d = 0;
  for (; d + kW <= n; d += kW) vstore(x + d, vmul(vload(x + d), vs));
  if (d < n) {
    const vmask m = vfirst(n - d);
    vstore(x + d, vmul(vload(x + d, m), vs), m);
  }
}

// Rows [i0, i1) of one head's output and log-sum-exp.
REMAT_SIMD_FN void forward_block(const ForwardBlock& f) {
  const std::int64_t D = f.d, rows = f.i1 - f.i0;
  float m[kTileQ], l[kTileQ];
  for (std::int64_t r = 0; r < rows; ++r) {
    m[r] = -__builtin_inff();
    l[r] = 0.0f;
  }
  zero_rows(f.acc, rows * D);
  const std::int64_t key_end = f.causal ? f.i1 : f.s;
  const Trim cols = f.causal ? Trim::cols : Trim::none,
             keys = f.causal ? Trim::k_upper : Trim::none;
  for (std::int64_t j0 = 0; j0 < key_end; j0 += kTileK) {
    const std::int64_t n = std::min(key_end, j0 + kTileK) - j0;
    // Raw scores Q K^T of the tile.
    product(Product{f.q + f.i0 * D, D, 1, f.kt + j0 * D, kTileK, f.p, kTileK, rows, n, D, cols,
                    f.i0 - j0, false});
    for (std::int64_t r = 0; r < rows; ++r) {
      float* pr = f.p + r * kTileK;
      const std::int64_t lim = f.causal ? std::min(n, f.i0 + r + 1 - j0) : n;
      if (lim <= 0) {
        for (std::int64_t c = 0; c < kTileK; c += kW) vstore(pr + c, vzero());
        continue;
      }
      const float alpha = softmax_row(pr, lim, f.scale, m[r], l[r]);
      if (alpha != 1.0f) scale_row(f.acc + r * D, D, alpha);
    }
    // acc += P V.
    product(Product{f.p, kTileK, 1, f.v + j0 * D, D, f.acc, D, rows, D, n, keys, f.i0 - j0, true});
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t i = f.i0 + r;
    const vf vl = vset1(l[r]);
    const float* a = f.acc + r * D;
    float* o = f.out + i * D;
    std::int64_t d = 0;
    for (; d + kW <= D; d += kW) vstore(o + d, vdiv(vload(a + d), vl));
    if (d < D) {
      const vmask mk = vfirst(D - d);
      vstore(o + d, vdiv(vload(a + d, mk), vl), mk);
    }
    f.lse[i] = m[r] + std::log(l[r]);
  }
}

// One score row of the backward: p[0, lim) holds q.k and ds[0, lim) dO.v of
// the keys that count. Leaves P = exp(score * scale - lse) in p and
// dS = scale * P (dP - delta) in ds (the scale of dQ and dK folded in), 0 from
// lim up to kTileK. need_ds false: P only.
REMAT_SIMD_FN inline void backward_row(float* p, float* ds, std::int64_t lim, float scale,
                                       float lse, float delta, bool need_ds) {
  const std::int64_t groups = (std::max<std::int64_t>(lim, 0) + 15) / 16;
  const vf vs = vset1(scale), vlse = vset1(lse), vdelta = vset1(delta), zero = vzero();
  for (std::int64_t g = 0; g < groups; ++g)
#pragma GCC unroll 2
    for (int v = 0; v < kG; ++v) {
      const std::int64_t c = g * 16 + v * kW;
      const vmask m = row_lanes(lim, g, v);
      const vf pv = vselect(m, vexp(vsub(vmul(vload(p + c), vs), vlse)), zero);
      vstore(p + c, pv);
      if (need_ds)
        vstore(ds + c, vselect(m, vmul(vs, vmul(pv, vsub(vload(ds + c), vdelta))), zero));
    }
  for (std::int64_t c = groups * 16; c < kTileK; c += kW) {
    vstore(p + c, zero);
    if (need_ds) vstore(ds + c, zero);
  }
}

// Gradient contributions of query rows [i0, i1) against key tile [j0, j0 + n).
REMAT_SIMD_FN void backward_block(const BackwardBlock& w) {
  const std::int64_t D = w.d, rows = w.i1 - w.i0;
  const bool need_ds = w.dq || w.dk;
  const Trim cols = w.causal ? Trim::cols : Trim::none;
  const Trim queries = w.causal ? Trim::k_upper : Trim::none,
             keys = w.causal ? Trim::k_lower : Trim::none;
  product(Product{w.q + w.i0 * D, D, 1, w.kt, kTileK, w.p, kTileK, rows, w.n, D, cols, w.i0 - w.j0,
                  false});
  if (need_ds)  // dP = dO V^T
    product(Product{w.dout + w.i0 * D, D, 1, w.vt, kTileK, w.ds, kTileK, rows, w.n, D, cols,
                    w.i0 - w.j0, false});
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t i = w.i0 + r;
    const std::int64_t lim = w.causal ? std::clamp<std::int64_t>(i + 1 - w.j0, 0, w.n) : w.n;
    backward_row(w.p + r * kTileK, w.ds + r * kTileK, lim, w.scale, w.lse[i], w.delta[i], need_ds);
  }
  if (w.dq)  // dQ += dS K
    product(Product{w.ds, kTileK, 1, w.k + w.j0 * D, D, w.dq + w.i0 * D, D, rows, D, w.n, queries,
                    w.i0 - w.j0, !w.first_q});
  if (w.dv)  // dV += P^T dO
    product(Product{w.p, 1, kTileK, w.dout + w.i0 * D, D, w.dv + w.j0 * D, D, w.n, D, rows, keys,
                    w.j0 - w.i0, !w.first_kv});
  if (w.dk)  // dK += dS^T Q
    product(Product{w.ds, 1, kTileK, w.q + w.i0 * D, D, w.dk + w.j0 * D, D, w.n, D, rows, keys,
                    w.j0 - w.i0, !w.first_kv});
}

// y[i] = vexp(x[i]) for i < n.
REMAT_SIMD_FN void exp_array(const float* x, float* y, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + kW <= n; i += kW) vstore(y + i, vexp(vload(x + i)));
  if (i < n) {
    const vmask m = vfirst(n - i);
    vstore(y + i, vexp(vload(x + i, m)), m);
  }
}

constexpr Kernels kKernels{forward_block, backward_block, exp_array};
