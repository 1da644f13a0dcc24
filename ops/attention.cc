#include "ops/attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/binary.h"
#include "ops/kernel_util.h"
#include "ops/matmul.h"
#include "ops/op.h"
#include "ops/simd.h"
#include "ops/softmax.h"

namespace remat {

using namespace ops_detail;

namespace {

constexpr std::int64_t kTileQ = 64;  // query rows per block
constexpr std::int64_t kTileK = 64;  // keys per streamed tile
static_assert(kTileQ == kTileK, "query blocks and key tiles share boundaries");

using Geometry = AttentionGeometry;

// The CPU tiles (ops/attention_simd.h, compiled once per instruction set).
// One query block [i0, i1) of one head's forward; pointers are the head's.
struct ForwardBlock {
  const float* q;   // [S, D]
  const float* kt;  // K^T by key tiles: tile t is [D, kTileK] at kt + t * D * kTileK
  const float* v;  // [S, D]
  float* out;      // [S, D]
  float* lse;      // [S]
  std::int64_t s, d, i0, i1;
  bool causal;
  float scale;
  float* acc;  // scratch [kTileQ, D]
  float* p;    // scratch [kTileQ, kTileK]
};

// Query rows [i0, i1) of one head against its key tile [j0, j0 + n); null
// dq / dk / dv are skipped. The first block of a dq row (first_q: the first
// key tile) or of a dk / dv row (first_kv: the tile's first query block)
// writes it, later ones add to it.
struct BackwardBlock {
  const float *q, *k, *dout, *lse, *delta;  // the head's [S, D] / [S]
  const float *kt, *vt;                     // the tile's K^T and V^T [D, kTileK]
  std::int64_t d, i0, i1, j0, n;
  bool causal;
  float scale;
  float *p, *ds;         // scratch [kTileQ, kTileK]
  float *dq, *dk, *dv;  // the head's [S, D]
  bool first_q, first_kv;
};

struct Kernels {
  void (*forward)(const ForwardBlock&);
  void (*backward)(const BackwardBlock&);
  void (*exp)(const float*, float*, std::int64_t);
};

namespace avx2 {
#define REMAT_SIMD_WIDTH 8
#define REMAT_SIMD_FN
#include "ops/attention_simd.h"
#undef REMAT_SIMD_FN
#undef REMAT_SIMD_WIDTH
}  // namespace avx2

namespace avx512 {
#define REMAT_SIMD_WIDTH 16
#define REMAT_SIMD_FN __attribute__((target("avx512f")))
#include "ops/attention_simd.h"
#undef REMAT_SIMD_FN
#undef REMAT_SIMD_WIDTH
}  // namespace avx512

const Kernels& kernels() {
  return simd_path() == Simd::avx512 ? avx512::kKernels : avx2::kKernels;
}

std::int64_t num_tiles(std::int64_t n, std::int64_t tile) { return (n + tile - 1) / tile; }

// Tasks per parallel chunk for tasks of about `macs` multiply-adds each, so
// tiny problems run inline (threads only change speed, never results).
std::int64_t task_grain(std::int64_t macs) {
  return std::max<std::int64_t>(1, (std::int64_t(1) << 18) / std::max<std::int64_t>(macs, 1));
}

// Task t of n tiles visits tiles from both ends alternately (0, n-1, 1, n-2,
// ...), so the contiguous chunks parallel_for hands out get similar causal work.
std::int64_t zigzag(std::int64_t t, std::int64_t n) { return t % 2 == 0 ? t / 2 : n - 1 - t / 2; }

// y[d * ldy + c] = x[c * ldx + d] for c, d < 8 (AVX2 shuffles).
inline void transpose8x8(const float* x, std::int64_t ldx, float* y, std::int64_t ldy) {
  __m256 r[8], t[8], u[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(x + i * ldx);
#pragma GCC unroll 4
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
#pragma GCC unroll 2
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(y + i * ldy, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
    _mm256_storeu_ps(y + (i + 4) * ldy, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
  }
}

// Rows [0, n) of x [n, D] transposed into xt [D, ld] (columns [0, n)).
void transpose_rows(const float* x, std::int64_t n, std::int64_t D, std::int64_t ld, float* xt) {
  std::int64_t c0 = 0;
  for (; c0 + 8 <= n; c0 += 8) {
    std::int64_t d0 = 0;
    for (; d0 + 8 <= D; d0 += 8) transpose8x8(x + c0 * D + d0, D, xt + d0 * ld + c0, ld);
    for (std::int64_t d = d0; d < D; ++d)
      for (std::int64_t c = c0; c < c0 + 8; ++c) xt[d * ld + c] = x[c * D + d];
  }
  for (std::int64_t d = 0; d < D; ++d)
    for (std::int64_t c = c0; c < n; ++c) xt[d * ld + c] = x[c * D + d];
}

// out = softmax(q k^T * scale) v and lse = log-sum-exp of each score row, one
// task per (query head, query block), streaming over key tiles with a running
// max and sum per row. Each task writes only its own rows; a chunk of tasks
// keeps the K^T of the key/value head it is on.
void forward_kernel(const float* q, const float* k, const float* v, float* out, float* lse,
                    const Geometry& g) {
  const std::int64_t S = g.s, D = g.d;
  const std::int64_t nq = num_tiles(S, kTileQ);
  const Kernels& kern = kernels();
  parallel_for(0, g.bh * nq, task_grain(2 * kTileQ * S * D), [&](std::int64_t t0, std::int64_t t1) {
    std::vector<float> acc(std::size_t(kTileQ * D)), kt(std::size_t(D * nq * kTileK));
    std::vector<float> p(kTileQ * kTileK);
    std::int64_t head = -1;
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t bh = t / nq, kvh = bh / g.group;
      const std::int64_t i0 = zigzag(t % nq, nq) * kTileQ, i1 = std::min(S, i0 + kTileQ);
      if (kvh != head) {
        for (std::int64_t j0 = 0; j0 < S; j0 += kTileK)
          transpose_rows(k + (kvh * S + j0) * D, std::min(kTileK, S - j0), D, kTileK,
                         kt.data() + j0 * D);
        head = kvh;
      }
      kern.forward(ForwardBlock{q + bh * S * D, kt.data(), v + kvh * S * D, out + bh * S * D,
                                lse + bh * S, S, D, i0, i1, g.causal, g.scale, acc.data(), p.data()});
    }
  });
}

// One head's operands for backward (f32, contiguous [S, D] / [S]).
struct Head {
  const float *q, *k, *v, *dout, *lse, *delta;
};

// Scratch for one task of the backward: the key tile's K^T and V^T, P and dS.
struct Workspace {
  std::vector<float> kt, vt, p, ds;
  explicit Workspace(std::int64_t D)
      : kt(std::size_t(D * kTileK)), vt(std::size_t(D * kTileK)), p(kTileQ * kTileK),
        ds(kTileQ * kTileK) {}
  // Loads key tile [j0, j0 + n) of head h.
  void load_keys(const Head& h, std::int64_t j0, std::int64_t n, std::int64_t D) {
    transpose_rows(h.k + j0 * D, n, D, kTileK, kt.data());
    transpose_rows(h.v + j0 * D, n, D, kTileK, vt.data());
  }
};

// Gradient contributions of query rows [i0, i1) (at most kTileQ) against the
// key tile [j0, j0 + n) loaded in `w`. Each (row, key) pair's P and dS are
// computed the same way whichever schedule calls this, and every output row
// accumulates its terms in increasing key (dq) or row (dk, dv) order, so all
// schedules give bit-identical results.
void backward_block(const Kernels& kern, const Head& h, std::int64_t i0, std::int64_t i1,
                    std::int64_t j0, std::int64_t n, const Geometry& g, Workspace& w, float* dq,
                    float* dk, float* dv) {
  const bool first_q = j0 == 0, first_kv = i0 == (g.causal ? j0 : 0);
  kern.backward(BackwardBlock{h.q, h.k, h.dout, h.lse, h.delta, w.kt.data(), w.vt.data(), g.d, i0,
                              i1, j0, n, g.causal, g.scale, w.p.data(), w.ds.data(), dq, dk, dv,
                              first_q, first_kv});
}

// Fills dq, dk, dv ([bh, S, D] buffers, per query head, null when not
// needed; k and v are [bh / group, S, D]): every row is written by its first
// block (backward_block) and accumulated after.
void backward_kernel(const float* q, const float* k, const float* v, const float* out,
                     const float* dout, const float* lse, float* dq, float* dk, float* dv,
                     const Geometry& g) {
  const std::int64_t S = g.s, D = g.d, HS = S * D, G = g.group;
  const Kernels& kern = kernels();
  // Delta_i = rowsum(dO_i * O_i).
  std::vector<float> delta(std::size_t(g.bh * S));
  parallel_rows(g.bh * S, D, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) delta[std::size_t(r)] = lane_dot(dout + r * D, out + r * D, D);
  });
  auto head = [&](std::int64_t bh) {
    return Head{q + bh * HS, k + (bh / G) * HS, v + (bh / G) * HS, dout + bh * HS, lse + bh * S,
                delta.data() + bh * S};
  };
  auto at = [&](float* base, std::int64_t bh) { return base ? base + bh * HS : nullptr; };
  // Key tile j meets query blocks [i0, i0 + kTileQ) from its own start (causal) or from 0.
  auto key_tile = [&](const Head& h, std::int64_t j0, Workspace& w, float* hq, float* hk, float* hv) {
    const std::int64_t n = std::min(S, j0 + kTileK) - j0;
    w.load_keys(h, j0, n, D);
    for (std::int64_t i0 = g.causal ? j0 : 0; i0 < S; i0 += kTileQ)
      backward_block(kern, h, i0, std::min(S, i0 + kTileQ), j0, n, g, w, hq, hk, hv);
  };
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
          backward_block(kern, h, i0, i1, j0, n, g, w, at(dq, bh), nullptr, nullptr);
        }
      }
    });
  }
}

// Grouped-query attention: a key/value gradient per query head [B, H, S, D]
// summed over the `group` query heads of each key/value head, in increasing
// head order (one fixed order on every path), into [B, Hkv, S, D].
Tensor sum_query_groups(const Tensor& per_query_head, const Geometry& g, const Shape& kv_sizes) {
  if (!per_query_head.defined() || g.group == 1) return per_query_head;
  const std::int64_t rows = g.s * g.d, kv_heads = g.bh / g.group;
  Tensor out = empty(kv_sizes, DType::f32);
  if (skip_compute(out)) return out;
  const float* src = per_query_head.data<float>();
  float* dst = out.data<float>();
  parallel_rows(kv_heads, g.group * rows, [&](std::int64_t h0, std::int64_t h1) {
    for (std::int64_t h = h0; h < h1; ++h) {
      float* o = dst + h * rows;
      const float* first = src + h * g.group * rows;
      std::copy(first, first + rows, o);
      for (std::int64_t j = 1; j < g.group; ++j) {
        const float* x = first + j * rows;
        for (std::int64_t i = 0; i < rows; ++i) o[i] += x[i];
      }
    }
  });
  return out;
}

// The CPU forward: {out, lse} in f32.
std::vector<Tensor> forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Geometry& geo) {
  const Tensor qf = f32_contiguous(q), kf = f32_contiguous(k), vf = f32_contiguous(v);
  Tensor o = empty(q.sizes(), DType::f32);
  Tensor l = empty({q.size(0), q.size(1), q.size(2)}, DType::f32);
  if (skip_compute(l)) return {o, l};
  forward_kernel(qf.data<float>(), kf.data<float>(), vf.data<float>(), o.data<float>(), l.data<float>(), geo);
  return {o, l};
}

// The CPU backward: {dq, dk, dv} in f32, dk and dv summed over each group's query heads.
std::vector<Tensor> backward_cpu(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& out, const Tensor& lse, const Geometry& g, bool need_dq,
                                 bool need_dk, bool need_dv) {
  const Tensor qf = f32_contiguous(q), kf = f32_contiguous(k), vf = f32_contiguous(v);
  const Tensor of = f32_contiguous(out), gf = f32_contiguous(grad), lf = f32_contiguous(lse);
  // dk / dv per query head ([B, H, S, D]); grouped-query sums them below.
  Tensor dq, dk, dv;
  if (need_dq) dq = empty(q.sizes(), DType::f32);
  if (need_dk) dk = empty(q.sizes(), DType::f32);
  if (need_dv) dv = empty(q.sizes(), DType::f32);
  if (!skip_compute(qf)) {
    auto ptr = [](const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; };
    backward_kernel(qf.data<float>(), kf.data<float>(), vf.data<float>(), of.data<float>(), gf.data<float>(),
                    lf.data<float>(), ptr(dq), ptr(dk), ptr(dv), g);
  }
  return {dq, sum_query_groups(dk, g, k.sizes()), sum_query_groups(dv, g, k.sizes())};
}

const KernelRegistration<AttentionKernels> kCpu(attention_kernels(), DeviceType::CPU, {forward_cpu, backward_cpu},
                                                KernelDTypes::f32);

// ---------------------------------------------------------------------------
// The op

struct AttentionState {
  bool causal = true;
  double scale = 0;  // 0: 1/sqrt(D)
};

void check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  check_floating(op, q, "q");
  check_defined(op, k, "k");
  check_defined(op, v, "v");
  check_same(op, q, k);
  check_same(op, q, v);
  REMAT_CHECK(q.dim() == 4, ShapeError, op, ": q must be [B, H, S, D], got ", describe(q));
  const bool kv_ok = k.dim() == 4 && k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(2) == q.size(2) &&
                     k.size(3) == q.size(3) && k.size(1) > 0 && q.size(1) % k.size(1) == 0;
  REMAT_CHECK(kv_ok, ShapeError, op,
              ": q must be [B, H, S, D] and k, v one shape [B, Hkv, S, D] with Hkv dividing H "
              "(grouped-query attention), got q ", describe(q), ", k ", describe(k), ", v ", describe(v));
  REMAT_CHECK(q.size(3) > 0, ShapeError, op, ": head dim D must be positive, got q ", describe(q));
}

// The softmax scale: `scale`, or 1/sqrt(D) when it is 0.
double resolve_scale(const char* op, double scale, std::int64_t d) {
  REMAT_CHECK(std::isfinite(scale), Error, op, ": scale must be finite (0 for 1/sqrt(D)), got ", scale);
  return scale == 0.0 ? 1.0 / std::sqrt(double(d)) : scale;
}

// The geometry of a call with q [B, H, S, D] and k [B, Hkv, S, D].
Geometry geometry(const Shape& q, const Shape& k, const AttentionState& s) {
  return Geometry{q[0] * q[1], q[2], q[3], s.causal, float(resolve_scale("attention", s.scale, q[3])),
                  q[1] / k[1]};
}

void check(const OpDef& op, const std::vector<Tensor>& in, const AttentionState& s) {
  check_attention(op.name(), in[0], in[1], in[2]);
  resolve_scale(op.name(), s.scale, in[0].size(3));
}

OpResults forward(const std::vector<Tensor>& in, AttentionState& s) {
  const Geometry geo = geometry(in[0].sizes(), in[1].sizes(), s);
  return {attention_kernels().run(in[0].device(), &AttentionKernels::forward, in[0], in[1], in[2], geo)};
}

// Backward needs all five whichever inputs want gradients: P from q, k and
// lse, dP from v, Delta from out.
std::vector<Tensor> backward(const OpBackward<AttentionState>& b) {
  const Geometry geo = geometry(b.input(0).sizes, b.input(1).sizes, b.state());
  return attention_kernels().run(b.grad().device(), &AttentionKernels::backward, b.grad(), b.saved("q"),
                                 b.saved("k"), b.saved("v"), b.saved("out"), b.saved("lse"), geo, b.needs(0),
                                 b.needs(1), b.needs(2));
}

// The two products, counted whole (as model FLOPs count attention).
OpCost cost(const std::vector<Tensor>& in, const AttentionState&) {
  const Tensor& q = in[0];
  const double bh = double(q.size(0) * q.size(1)), s = double(q.size(2)), d = double(q.size(3));
  const double es = double(element_size(q.dtype()));
  return {4.0 * bh * s * s * d, 5.0 * bh * s * s,
          (double(q.numel()) * 2 + double(in[1].numel()) + double(in[2].numel())) * es};
}

// Two outputs (out and the row log-sum-exp) so that a selective checkpoint
// can cache both and skip the kernel on replay.
const Op<AttentionState> kAttention(
    {.name = "scaled_dot_product_attention",
     .inputs = {"q", "k", "v"},
     .outputs = {{"out"}, {"lse", always(DType::f32), false}},
     .saves = {{"q", SaveFrom::input, 0},
               {"k", SaveFrom::input, 1},
               {"v", SaveFrom::input, 2},
               {"out", SaveFrom::output, 0},
               {"lse", SaveFrom::output, 1}},
     .replay_cacheable = true,
     .summary = "softmax(q k^T * scale [+ causal mask]) v, fused (flash-style tiles), grouped-query heads"},
    {.check = check, .forward = forward, .backward = backward, .cost = cost}, &attention_kernels());

}  // namespace

KernelTable<AttentionKernels>& attention_kernels() {
  static KernelTable<AttentionKernels> t("scaled_dot_product_attention");
  return t;
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                    double scale) {
  return kAttention({q, k, v}, {causal, scale})[0];
}

Tensor attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                           double scale) {
  check_attention("attention_reference", q, k, v);
  const double sc = resolve_scale("attention_reference", scale, q.size(3));
  const std::int64_t group = q.size(1) / k.size(1);
  auto per_query_head = [&](const Tensor& t) {  // differentiable repeat of the kv heads
    if (group == 1) return t;
    const std::int64_t B = t.size(0), Hkv = t.size(1), S = t.size(2), D = t.size(3);
    return t.reshape({B, Hkv, 1, S, D}).expand({B, Hkv, group, S, D}).reshape({B, Hkv * group, S, D});
  };
  const Tensor kq = per_query_head(k), vq = per_query_head(v);
  Tensor scores = mul(matmul(q, kq.transpose(-1, -2)), sc);
  if (causal) {
    const std::int64_t S = q.size(2);
    std::vector<float> mask(std::size_t(S * S), 0.0f);
    for (std::int64_t i = 0; i < S; ++i)
      for (std::int64_t j = i + 1; j < S; ++j) mask[std::size_t(i * S + j)] = -1e30f;
    scores = add(scores, from_vector<float>(mask, {S, S}, q.device()).to(q.dtype()));
  }
  return matmul(softmax(scores, -1), vq);
}

void ops_detail::attention_exp(const float* x, float* y, std::int64_t n) { kernels().exp(x, y, n); }

}  // namespace remat
