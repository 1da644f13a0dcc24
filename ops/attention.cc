#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cuda/attention.h"
#include "ops/binary.h"
#include "ops/kernel_util.h"
#include "ops/matmul.h"
#include "ops/softmax.h"

namespace remat {

using namespace ops_detail;

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";
constexpr std::int64_t kTileQ = 32;  // query rows per block
constexpr std::int64_t kTileK = 32;  // keys per streamed tile (4 vectors of 8)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Eight floats in one AVX register (GCC/Clang vector extension). Every sum
// below accumulates each output element in a fixed sequential order, so
// vectorisation changes nothing in the results.
using vf8 = float __attribute__((vector_size(32)));
static_assert(kTileK == 32, "tile_scores keeps a row of scores in four vf8 registers");

inline vf8 load8(const float* p) {
  vf8 v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, vf8 v) { __builtin_memcpy(p, &v, sizeof v); }
inline vf8 splat(float x) { return vf8{x, x, x, x, x, x, x, x}; }

void check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  check_floating(op, q, "q");
  check_defined(op, k, "k");
  check_defined(op, v, "v");
  check_same(op, q, k);
  check_same(op, q, v);
  check_kernel_device(op, q);
  REMAT_CHECK(q.dim() == 4, ShapeError, op, ": q must be [B, H, S, D], got ", describe(q));
  REMAT_CHECK(k.sizes() == q.sizes() && v.sizes() == q.sizes(), ShapeError, op,
              ": q, k and v must have the same shape [B, H, S, D], got q ", describe(q), ", k ",
              describe(k), ", v ", describe(v));
  REMAT_CHECK(q.size(3) > 0, ShapeError, op, ": head dim D must be positive, got q ", describe(q));
}

// The softmax scale: `scale`, or 1/sqrt(D) when it is 0.
double resolve_scale(const char* op, double scale, std::int64_t d) {
  REMAT_CHECK(std::isfinite(scale), Error, op, ": scale must be finite (0 for 1/sqrt(D)), got ",
              scale);
  return scale == 0.0 ? 1.0 / std::sqrt(double(d)) : scale;
}

// Problem geometry shared by forward and backward: bh = B * H heads of S rows of D.
struct Geometry {
  std::int64_t bh = 0, s = 0, d = 0;
  bool causal = true;
  float scale = 1.0f;
};

std::int64_t num_tiles(std::int64_t n, std::int64_t tile) { return (n + tile - 1) / tile; }

// Tasks per parallel chunk for tasks of about `macs` multiply-adds each, so
// tiny problems run inline (threads only change speed, never results).
std::int64_t task_grain(std::int64_t macs) {
  return std::max<std::int64_t>(1, (std::int64_t(1) << 18) / std::max<std::int64_t>(macs, 1));
}

// Task t of n tiles visits tiles from both ends alternately (0, n-1, 1, n-2,
// ...), so the contiguous chunks parallel_for hands out get similar causal work.
std::int64_t zigzag(std::int64_t t, std::int64_t n) { return t % 2 == 0 ? t / 2 : n - 1 - t / 2; }

// Rows [0, n) of x [n, D] transposed into xt [D, kTileK], zero-padded to kTileK columns.
void transpose_tile(const float* x, std::int64_t n, std::int64_t D, float* xt) {
  for (std::int64_t d = 0; d < D; ++d) {
    float* row = xt + d * kTileK;
    for (std::int64_t c = 0; c < n; ++c) row[c] = x[c * D + d];
    for (std::int64_t c = n; c < kTileK; ++c) row[c] = 0.0f;
  }
}

// out[r][c] = sum_d a[r][d] * bt[d][c] for rows [0, rows) of a [rows, D] and
// the kTileK columns of bt [D, kTileK] (sums over d in order). Two rows at a
// time: eight independent accumulator chains.
void tile_scores(const float* a, std::int64_t rows, const float* bt, std::int64_t D, float* out) {
  std::int64_t r = 0;
  for (; r + 2 <= rows; r += 2) {
    const float* a0 = a + r * D;
    const float* a1 = a0 + D;
    vf8 c00{}, c01{}, c02{}, c03{}, c10{}, c11{}, c12{}, c13{};
    for (std::int64_t d = 0; d < D; ++d) {
      const float* b = bt + d * kTileK;
      const vf8 b0 = load8(b), b1 = load8(b + 8), b2 = load8(b + 16), b3 = load8(b + 24);
      const vf8 x0 = splat(a0[d]), x1 = splat(a1[d]);
      c00 += x0 * b0;
      c01 += x0 * b1;
      c02 += x0 * b2;
      c03 += x0 * b3;
      c10 += x1 * b0;
      c11 += x1 * b1;
      c12 += x1 * b2;
      c13 += x1 * b3;
    }
    float* o = out + r * kTileK;
    store8(o, c00);
    store8(o + 8, c01);
    store8(o + 16, c02);
    store8(o + 24, c03);
    store8(o + kTileK, c10);
    store8(o + kTileK + 8, c11);
    store8(o + kTileK + 16, c12);
    store8(o + kTileK + 24, c13);
  }
  for (; r < rows; ++r) {
    const float* ar = a + r * D;
    vf8 c0{}, c1{}, c2{}, c3{};
    for (std::int64_t d = 0; d < D; ++d) {
      const vf8 x = splat(ar[d]);
      const float* b = bt + d * kTileK;
      c0 += x * load8(b);
      c1 += x * load8(b + 8);
      c2 += x * load8(b + 16);
      c3 += x * load8(b + 24);
    }
    float* o = out + r * kTileK;
    store8(o, c0);
    store8(o + 8, c1);
    store8(o + 16, c2);
    store8(o + 24, c3);
  }
}

// y[0..D) += sum_{t in [t0, t1)} w[t * ws] * x[t * D + (0..D)], summed in
// order of t for every element (32 columns at a time: four independent chains).
void accumulate_rows(float* y, const float* w, std::int64_t ws, const float* x, std::int64_t t0,
                     std::int64_t t1, std::int64_t D) {
  std::int64_t d = 0;
  for (; d + 32 <= D; d += 32) {
    vf8 a0 = load8(y + d), a1 = load8(y + d + 8), a2 = load8(y + d + 16), a3 = load8(y + d + 24);
    for (std::int64_t t = t0; t < t1; ++t) {
      const vf8 s = splat(w[t * ws]);
      const float* xr = x + t * D + d;
      a0 += s * load8(xr);
      a1 += s * load8(xr + 8);
      a2 += s * load8(xr + 16);
      a3 += s * load8(xr + 24);
    }
    store8(y + d, a0);
    store8(y + d + 8, a1);
    store8(y + d + 16, a2);
    store8(y + d + 24, a3);
  }
  for (; d + 8 <= D; d += 8) {
    vf8 acc = load8(y + d);
    for (std::int64_t t = t0; t < t1; ++t) acc += splat(w[t * ws]) * load8(x + t * D + d);
    store8(y + d, acc);
  }
  for (; d < D; ++d) {
    float acc = y[d];
    for (std::int64_t t = t0; t < t1; ++t) acc += w[t * ws] * x[t * D + d];
    y[d] = acc;
  }
}

// out = softmax(q k^T * scale) v and lse = log-sum-exp of each score row, one
// task per (head, query tile), streaming over key tiles with a running max and
// sum per row. Each task writes only its own rows.
void forward_kernel(const float* q, const float* k, const float* v, float* out, float* lse,
                    const Geometry& g) {
  const std::int64_t S = g.s, D = g.d;
  const std::int64_t nq = num_tiles(S, kTileQ);
  parallel_for(0, g.bh * nq, task_grain(2 * kTileQ * S * D), [&](std::int64_t t0, std::int64_t t1) {
    std::vector<float> acc(std::size_t(kTileQ * D)), kt(std::size_t(D * kTileK));
    std::vector<float> m(kTileQ), l(kTileQ), p(kTileQ * kTileK);
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t bh = t / nq;
      const std::int64_t i0 = zigzag(t % nq, nq) * kTileQ, i1 = std::min(S, i0 + kTileQ);
      const float* Q = q + bh * S * D;
      const float* K = k + bh * S * D;
      const float* V = v + bh * S * D;
      std::fill(acc.begin(), acc.end(), 0.0f);
      std::fill(m.begin(), m.end(), kNegInf);
      std::fill(l.begin(), l.end(), 0.0f);
      const std::int64_t key_end = g.causal ? i1 : S;
      for (std::int64_t j0 = 0; j0 < key_end; j0 += kTileK) {
        const std::int64_t n = std::min(key_end, j0 + kTileK) - j0;
        transpose_tile(K + j0 * D, n, D, kt.data());
        tile_scores(Q + i0 * D, i1 - i0, kt.data(), D, p.data());
        for (std::int64_t i = i0; i < i1; ++i) {
          const std::int64_t r = i - i0;
          const std::int64_t c_end = g.causal ? std::min(n, i + 1 - j0) : n;
          if (c_end <= 0) continue;
          float* pr = p.data() + r * kTileK;
          float tile_max = kNegInf;
          for (std::int64_t c = 0; c < c_end; ++c) {
            pr[c] *= g.scale;
            tile_max = std::max(tile_max, pr[c]);
          }
          const float m_old = m[std::size_t(r)], m_new = std::max(m_old, tile_max);
          const float alpha = m_old == kNegInf ? 0.0f : std::exp(m_old - m_new);
          for (std::int64_t c = 0; c < c_end; ++c) pr[c] = std::exp(pr[c] - m_new);
          l[std::size_t(r)] = l[std::size_t(r)] * alpha + lane_sum(pr, c_end);
          float* a = acc.data() + r * D;
          if (alpha != 1.0f)
            for (std::int64_t d = 0; d < D; ++d) a[d] *= alpha;
          accumulate_rows(a, pr, 1, V + j0 * D, 0, c_end, D);
          m[std::size_t(r)] = m_new;
        }
      }
      for (std::int64_t i = i0; i < i1; ++i) {
        const std::int64_t r = i - i0;
        const float* a = acc.data() + r * D;
        float* o = out + (bh * S + i) * D;
        const float li = l[std::size_t(r)];
        for (std::int64_t d = 0; d < D; ++d) o[d] = a[d] / li;
        lse[bh * S + i] = m[std::size_t(r)] + std::log(li);
      }
    }
  });
}

// One head's operands for backward (f32, contiguous [S, D] / [S]).
struct Head {
  const float *q, *k, *v, *dout, *lse, *delta;
};

// Scratch for backward_block: the key tile's K^T and V^T, P and dS blocks.
struct Workspace {
  std::vector<float> kt, vt, p, ds;
  explicit Workspace(std::int64_t D)
      : kt(std::size_t(D * kTileK)), vt(std::size_t(D * kTileK)), p(kTileQ * kTileK),
        ds(kTileQ * kTileK) {}
  // Loads key tile [j0, j0 + n) of head h.
  void load_keys(const Head& h, std::int64_t j0, std::int64_t n, std::int64_t D) {
    transpose_tile(h.k + j0 * D, n, D, kt.data());
    transpose_tile(h.v + j0 * D, n, D, vt.data());
  }
};

// Gradient contributions of query rows [i0, i1) (at most kTileQ) against the
// key tile [j0, j0 + n) loaded in `w`, causal pairs excluded. Each (row, key)
// pair's P and dS are computed the same way whichever schedule calls this,
// and every output row accumulates its terms in increasing key (dq) or row
// (dk, dv) order, so all schedules give bit-identical results. Null dq / dk /
// dv are skipped.
void backward_block(const Head& h, std::int64_t i0, std::int64_t i1, std::int64_t j0,
                    std::int64_t n, const Geometry& g, Workspace& w, float* dq, float* dk,
                    float* dv) {
  const std::int64_t D = g.d, rows = i1 - i0;
  float* P = w.p.data();
  float* dS = w.ds.data();
  const bool need_ds = dq || dk;
  tile_scores(h.q + i0 * D, rows, w.kt.data(), D, P);
  if (need_ds) tile_scores(h.dout + i0 * D, rows, w.vt.data(), D, dS);  // dP = dO V^T
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t i = i0 + r;
    const std::int64_t c_end = g.causal ? std::clamp<std::int64_t>(i + 1 - j0, 0, n) : n;
    const float lse_i = h.lse[i], delta_i = h.delta[i];
    float* pr = P + r * kTileK;
    float* dsr = dS + r * kTileK;
    for (std::int64_t c = 0; c < c_end; ++c) {
      pr[c] = std::exp(pr[c] * g.scale - lse_i);  // P recomputed from the saved log-sum-exp
      // dS = P (dP - Delta); the scale of dQ and dK folded in.
      if (need_ds) dsr[c] = g.scale * (pr[c] * (dsr[c] - delta_i));
    }
    if (dq && c_end > 0) accumulate_rows(dq + i * D, dsr, 1, h.k + j0 * D, 0, c_end, D);
  }
  // Key c gets rows i >= j0 + c under the causal mask.
  for (std::int64_t c = 0; c < n; ++c) {
    const std::int64_t r0 = g.causal ? std::clamp<std::int64_t>(j0 + c - i0, 0, rows) : 0;
    if (r0 == rows) continue;
    if (dv) accumulate_rows(dv + (j0 + c) * D, P + c, kTileK, h.dout + i0 * D, r0, rows, D);
    if (dk) accumulate_rows(dk + (j0 + c) * D, dS + c, kTileK, h.q + i0 * D, r0, rows, D);
  }
}

// Fills dq, dk, dv (zeroed [bh, S, D] buffers, null when not needed).
void backward_kernel(const float* q, const float* k, const float* v, const float* out,
                     const float* dout, const float* lse, float* dq, float* dk, float* dv,
                     const Geometry& g) {
  const std::int64_t S = g.s, D = g.d, HS = S * D;
  // Delta_i = rowsum(dO_i * O_i).
  std::vector<float> delta(std::size_t(g.bh * S));
  parallel_rows(g.bh * S, D, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) delta[std::size_t(r)] = lane_dot(dout + r * D, out + r * D, D);
  });
  auto head = [&](std::int64_t bh) {
    return Head{q + bh * HS, k + bh * HS, v + bh * HS, dout + bh * HS, lse + bh * S,
                delta.data() + bh * S};
  };
  auto at = [&](float* base, std::int64_t bh) { return base ? base + bh * HS : nullptr; };
  // Key tile j meets query blocks [i0, i0 + kTileQ) from its own start (causal) or from 0.
  auto key_tile = [&](const Head& h, std::int64_t j0, Workspace& w, float* hq, float* hk, float* hv) {
    const std::int64_t n = std::min(S, j0 + kTileK) - j0;
    w.load_keys(h, j0, n, D);
    for (std::int64_t i0 = g.causal ? j0 : 0; i0 < S; i0 += kTileQ)
      backward_block(h, i0, std::min(S, i0 + kTileQ), j0, n, g, w, hq, hk, hv);
  };
  static_assert(kTileQ == kTileK, "query blocks and key tiles share boundaries");
  const std::int64_t nk = num_tiles(S, kTileK), nq = num_tiles(S, kTileQ);
  if (g.bh >= num_threads()) {
    // Enough heads: one pass per head on one thread.
    parallel_for(0, g.bh, task_grain(5 * S * S * D), [&](std::int64_t b0, std::int64_t b1) {
      Workspace w(D);
      for (std::int64_t bh = b0; bh < b1; ++bh)
        for (std::int64_t j0 = 0; j0 < S; j0 += kTileK)
          key_tile(head(bh), j0, w, at(dq, bh), at(dk, bh), at(dv, bh));
    });
    return;
  }
  // Few heads: parallel over key tiles for dK / dV, then over query blocks
  // for dQ (P computed once more, but every task owns its output rows).
  if (dk || dv) {
    parallel_for(0, g.bh * nk, task_grain(4 * kTileK * S * D), [&](std::int64_t t0, std::int64_t t1) {
      Workspace w(D);
      for (std::int64_t t = t0; t < t1; ++t) {
        const std::int64_t bh = t / nk;
        key_tile(head(bh), zigzag(t % nk, nk) * kTileK, w, nullptr, at(dk, bh), at(dv, bh));
      }
    });
  }
  if (dq) {
    parallel_for(0, g.bh * nq, task_grain(3 * kTileQ * S * D), [&](std::int64_t t0, std::int64_t t1) {
      Workspace w(D);
      for (std::int64_t t = t0; t < t1; ++t) {
        const std::int64_t bh = t / nq, i0 = zigzag(t % nq, nq) * kTileQ;
        const std::int64_t i1 = std::min(S, i0 + kTileQ), key_end = g.causal ? i1 : S;
        const Head h = head(bh);
        for (std::int64_t j0 = 0; j0 < key_end; j0 += kTileK) {
          const std::int64_t n = std::min(S, j0 + kTileK) - j0;
          w.load_keys(h, j0, n, D);
          backward_block(h, i0, i1, j0, n, g, w, at(dq, bh), nullptr, nullptr);
        }
      }
    });
  }
}

// The CUDA backward: the fused kernels of cuda/attention.h on contiguous
// operands in their own dtype; gradients come back in q's dtype like the CPU's.
std::vector<Tensor> attention_backward_cuda(Node& n, const Tensor& grad, const Geometry& g,
                                            const Tensor& q, const Tensor& k, const Tensor& v,
                                            const Tensor& out, const Tensor& lse) {
  if constexpr (kHaveCuda) {
    const TensorOptions opts(q.dtype(), q.device());
    const Tensor qc = contiguous_detached(q), kc = contiguous_detached(k), vc = contiguous_detached(v);
    const Tensor oc = contiguous_detached(out), lc = contiguous_detached(lse);
    const Tensor gc = contiguous_detached(grad.dtype() == q.dtype() ? grad : grad.to(q.dtype()));
    Tensor dq, dk, dv;
    if (n.needs_input_grad(0)) dq = empty(q.sizes(), opts);
    if (n.needs_input_grad(1)) dk = empty(q.sizes(), opts);
    if (n.needs_input_grad(2)) dv = empty(q.sizes(), opts);
    Tensor delta = empty({g.bh, g.s}, TensorOptions(DType::f32, q.device()));
    auto ptr = [](const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; };
    cuda::attention_backward(qc.raw_data(), kc.raw_data(), vc.raw_data(), oc.raw_data(),
                             gc.raw_data(), lc.data<float>(), ptr(dq), ptr(dk), ptr(dv),
                             delta.data<float>(), g.bh, g.s, g.d, g.causal, g.scale, q.dtype(),
                             cuda_stream());
    return std::vector<Tensor>{dq, dk, dv};
  } else {
    no_cuda_kernel(kOp);
  }
}

std::vector<Tensor> attention_backward(Node& n, const Tensor& grad, const Geometry& g) {
  NoGradGuard ng;
  const Tensor q = n.saved(0), k = n.saved(1), v = n.saved(2), out = n.saved(3), lse = n.saved(4);
  if constexpr (kHaveCuda) {
    if (on_cuda(q)) return attention_backward_cuda(n, grad, g, q, k, v, out, lse);
  }
  const Tensor qf = f32_contiguous(q), kf = f32_contiguous(k), vf = f32_contiguous(v);
  const Tensor of = f32_contiguous(out), gf = f32_contiguous(grad), lf = f32_contiguous(lse);
  Tensor dq, dk, dv;
  if (n.needs_input_grad(0)) dq = zeros(q.sizes(), DType::f32);
  if (n.needs_input_grad(1)) dk = zeros(q.sizes(), DType::f32);
  if (n.needs_input_grad(2)) dv = zeros(q.sizes(), DType::f32);
  auto ptr = [](const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; };
  backward_kernel(qf.data<float>(), kf.data<float>(), vf.data<float>(), of.data<float>(),
                  gf.data<float>(), lf.data<float>(), ptr(dq), ptr(dk), ptr(dv), g);
  auto back = [&](const Tensor& t) { return t.defined() ? from_f32(t, q.dtype()) : Tensor(); };
  return std::vector<Tensor>{back(dq), back(dk), back(dv)};
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                    double scale) {
  check_attention(kOp, q, k, v);
  const float sc = float(resolve_scale(kOp, scale, q.size(3)));
  REMAT_CHECK(!on_cuda(q) || q.size(3) <= cuda::kAttentionMaxHeadDim, ShapeError, kOp,
              ": the CUDA kernel takes head dims up to ", cuda::kAttentionMaxHeadDim, ", got ",
              describe(q));
  // Dispatched with two outputs (out and the row log-sum-exp) so a selective
  // checkpoint can cache both and skip the kernel on replay.
  return dispatch(kOp, {q, k, v}, [&] {
    const Geometry geo{q.size(0) * q.size(1), q.size(2), q.size(3), causal, sc};
    std::vector<Tensor> res = kernel_or_cached([&] {
      NoGradGuard ng;
      if constexpr (kHaveCuda) {
        if (on_cuda(q)) {
          const Tensor qc = contiguous_detached(q), kc = contiguous_detached(k),
                       vc = contiguous_detached(v);
          Tensor o = empty(q.sizes(), TensorOptions(q.dtype(), q.device()));
          Tensor l = empty({q.size(0), q.size(1), q.size(2)}, TensorOptions(DType::f32, q.device()));
          cuda::attention_forward(qc.raw_data(), kc.raw_data(), vc.raw_data(), o.raw_data(),
                                  l.data<float>(), geo.bh, geo.s, geo.d, geo.causal, geo.scale,
                                  q.dtype(), cuda_stream());
          return std::vector<Tensor>{o, l};
        }
      }
      const Tensor qf = f32_contiguous(q), kf = f32_contiguous(k), vf = f32_contiguous(v);
      Tensor o = empty(q.sizes(), DType::f32);
      Tensor l = empty({q.size(0), q.size(1), q.size(2)}, DType::f32);
      forward_kernel(qf.data<float>(), kf.data<float>(), vf.data<float>(), o.data<float>(),
                     l.data<float>(), geo);
      return std::vector<Tensor>{from_f32(o, q.dtype()), l};
    });
    Tensor out = res[0].detach(), lse = res[1].detach();
    if (auto node = autograd::make_node(kOp, {&q, &k, &v})) {
      // Backward needs all five whichever inputs want gradients: P from q, k
      // and lse, dP from v, Delta from out.
      node->save(q);
      node->save(k);
      node->save(v);
      node->save(out, /*is_output=*/true);
      node->save(lse, /*is_output=*/true);
      node->backward_fn = [geo](Node& n, std::vector<Tensor>& g) {
        return attention_backward(n, g[0], geo);
      };
      autograd::set_history(out, node);
    }
    return std::vector<Tensor>{out, lse};
  })[0];
}

Tensor attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                           double scale) {
  check_attention("attention_reference", q, k, v);
  const double sc = resolve_scale("attention_reference", scale, q.size(3));
  Tensor scores = mul(matmul(q, k.transpose(-1, -2)), sc);
  if (causal) {
    const std::int64_t S = q.size(2);
    std::vector<float> mask(std::size_t(S * S), 0.0f);
    for (std::int64_t i = 0; i < S; ++i)
      for (std::int64_t j = i + 1; j < S; ++j) mask[std::size_t(i * S + j)] = -1e30f;
    scores = add(scores, from_vector<float>(mask, {S, S}, q.device()).to(q.dtype()));
  }
  return matmul(softmax(scores, -1), v);
}

}  // namespace remat
