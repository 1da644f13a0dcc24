#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "engine/parallel_for.h"
#include "ops/attention.h"
#include "ops/ops.h"
#include "ops/simd.h"
#include "tests/ops/gradcheck.h"

using namespace remat;
using namespace remat::testing;

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

// max |got - want| / max(1, max |want|): the error relative to the tensor's scale.
double scaled_error(const Tensor& got, const Tensor& want) {
  REQUIRE(got.sizes() == want.sizes());
  const auto g = got.to(DType::f32).contiguous().to_vector<float>();
  const auto w = want.to(DType::f32).contiguous().to_vector<float>();
  double err = 0, mag = 1;
  for (std::size_t i = 0; i < g.size(); ++i) {
    err = std::max(err, std::abs(double(g[i]) - double(w[i])));
    mag = std::max(mag, std::abs(double(w[i])));
  }
  return err / mag;
}

struct Result {
  Tensor out, dq, dk, dv;
};

// Output and input gradients for a random output gradient.
template <typename F>
Result run(F f, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout) {
  Tensor lq = q.detach().set_requires_grad(true), lk = k.detach().set_requires_grad(true),
         lv = v.detach().set_requires_grad(true);
  Tensor out = f(lq, lk, lv);
  auto g = grad({out}, {lq, lk, lv}, {dout});
  return {out.detach(), g[0], g[1], g[2]};
}

Result fused(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, bool causal,
             double scale = 0) {
  return run([&](auto& a, auto& b, auto& c) { return scaled_dot_product_attention(a, b, c, causal, scale); },
             q, k, v, dout);
}

Result reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, bool causal,
                 double scale = 0) {
  return run([&](auto& a, auto& b, auto& c) { return attention_reference(a, b, c, causal, scale); },
             q, k, v, dout);
}

// Fused and reference agree on the output and all three gradients.
void check_matches(const Shape& shape, bool causal, double scale, std::uint64_t seed,
                   double tol = 1e-5) {
  INFO("shape " << shape_str(shape) << " causal " << causal << " scale " << scale);
  const Tensor q = normal(shape, seed), k = normal(shape, seed + 1), v = normal(shape, seed + 2);
  const Tensor dout = normal(shape, seed + 3);
  const Result a = fused(q, k, v, dout, causal, scale), b = reference(q, k, v, dout, causal, scale);
  CHECK(scaled_error(a.out, b.out) <= tol);
  CHECK(scaled_error(a.dq, b.dq) <= tol);
  CHECK(scaled_error(a.dk, b.dk) <= tol);
  CHECK(scaled_error(a.dv, b.dv) <= tol);
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.to_vector<float>() == b.to_vector<float>();
}

// Identical bytes (bit_equal also lets -0 match +0).
bool same_bits(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector<float>(), y = b.to_vector<float>();
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

using ops_detail::Simd;

// The CPU kernels' instruction set for one scope.
struct SimdScope {
  Simd saved = ops_detail::simd_path();
  explicit SimdScope(Simd s) { ops_detail::set_simd_path(s); }
  ~SimdScope() { ops_detail::set_simd_path(saved); }
  SimdScope(const SimdScope&) = delete;
  SimdScope& operator=(const SimdScope&) = delete;
};

// The paths this CPU runs: AVX2 always, AVX-512 where present.
std::vector<Simd> simd_paths() {
  std::vector<Simd> paths{Simd::avx2};
  if (ops_detail::cpu_has_avx512())
    paths.push_back(Simd::avx512);
  else
    WARN("this CPU has no AVX-512F: only the AVX2 kernels run");
  return paths;
}

// exp through the kernels' vector exp on path p.
std::vector<float> kernel_exp(const std::vector<float>& x, Simd p) {
  SimdScope scope(p);
  std::vector<float> y(x.size());
  ops_detail::attention_exp(x.data(), y.data(), std::int64_t(x.size()));
  return y;
}

}  // namespace

TEST_CASE("fused attention matches the reference: output and gradients", "[ops][attention]") {
  // Tolerance: max abs error <= 1e-5 * max(1, max |reference|), per tensor.
  // The CPU tiles are 64 x 64, products go in blocks of 8 rows and vectors
  // of 8 or 16 floats; the shapes cover every kind of remainder.
  for (bool causal : {true, false}) {
    check_matches({2, 3, 37, 16}, causal, 0, 10);    // S not a multiple of the tiles or the 8-row blocks
    check_matches({1, 2, 150, 8}, causal, 0, 20);    // three tiles, ragged last
    check_matches({1, 1, 64, 24}, causal, 0.5, 30);  // exactly one tile, explicit scale
    check_matches({2, 1, 5, 4}, causal, 0, 40);      // smaller than a tile
    check_matches({1, 2, 1, 8}, causal, 0, 50);      // one row
    check_matches({1, 2, 70, 44}, causal, 0, 70);    // D = 32 + 8 + 4: every vector tail
    check_matches({1, 1, 128, 64}, causal, 0, 80);   // two whole tiles at the benchmark head dim
  }
  // Peaked softmax (large scores): the running max must rescale correctly.
  check_matches({1, 2, 50, 8}, true, 4.0, 60);
}

TEST_CASE("fused attention: causal masking, layouts and dtypes", "[ops][attention]") {
  const Tensor q = normal({1, 2, 37, 8}, 1), k = normal({1, 2, 37, 8}, 2), v = normal({1, 2, 37, 8}, 3);
  // Row 0 attends only to key 0: its output is v[0]; future keys do not matter.
  Tensor out = scaled_dot_product_attention(q, k, v);
  CHECK(bit_equal(out.select(2, 0), v.select(2, 0)));
  Tensor k2 = k.clone(), v2 = v.clone();
  k2.narrow(2, 20, 17).fill_(5.0);
  v2.narrow(2, 20, 17).fill_(-3.0);
  CHECK(bit_equal(scaled_dot_product_attention(q, k2, v2).narrow(2, 0, 20), out.narrow(2, 0, 20)));
  // Non-contiguous inputs: [B, S, H, D] tensors viewed as [B, H, S, D].
  const Tensor qs = normal({2, 37, 3, 8}, 4), ks = normal({2, 37, 3, 8}, 5), vs = normal({2, 37, 3, 8}, 6);
  const Tensor qt = qs.transpose(1, 2), kt = ks.transpose(1, 2), vt = vs.transpose(1, 2);
  const Tensor dout = normal({2, 3, 37, 8}, 7);
  const Result a = fused(qt, kt, vt, dout, true);
  const Result b = fused(qt.contiguous(), kt.contiguous(), vt.contiguous(), dout, true);
  CHECK(bit_equal(a.out, b.out));
  CHECK(bit_equal(a.dq, b.dq));
  CHECK(bit_equal(a.dk, b.dk));
  CHECK(bit_equal(a.dv, b.dv));
  const Result r = reference(qt, kt, vt, dout, true);
  CHECK(scaled_error(a.dq, r.dq) <= 1e-5);
  // bf16: computed in f32, rounded once (tolerance: bf16 rounding of inputs and output).
  const Tensor qh = qt.to(DType::bf16), kh = kt.to(DType::bf16), vh = vt.to(DType::bf16);
  const Result h = fused(qh, kh, vh, dout.to(DType::bf16), true);
  CHECK(h.out.dtype() == DType::bf16);
  CHECK(h.dq.dtype() == DType::bf16);
  const Result hr = fused(qh.to(DType::f32), kh.to(DType::f32), vh.to(DType::f32),
                          dout.to(DType::bf16).to(DType::f32), true);
  CHECK(scaled_error(h.out, hr.out) <= 1e-2);
  CHECK(bit_equal(h.out.to(DType::f32), hr.out.to(DType::bf16).to(DType::f32)));  // rounded once: the f32 op's bits
  CHECK(scaled_error(h.dq, hr.dq) <= 2e-2);
  CHECK(scaled_error(h.dk, hr.dk) <= 2e-2);
  CHECK(scaled_error(h.dv, hr.dv) <= 2e-2);
}

TEST_CASE("fused attention: results do not depend on the thread count or on which inputs need grad",
          "[ops][attention]") {
  const int threads = num_threads();
  for (const Shape& shape : {Shape{1, 1, 160, 32}, Shape{2, 1, 100, 32}}) {
    const Tensor q = normal(shape, 1), k = normal(shape, 2), v = normal(shape, 3), dout = normal(shape, 4);
    for (bool causal : {true, false}) {
      set_num_threads(1);
      const Result one = fused(q, k, v, dout, causal);
      for (int t : {2, 3}) {
        INFO("shape " << shape_str(shape) << " causal " << causal << " threads " << t);
        set_num_threads(t);
        const Result many = fused(q, k, v, dout, causal);
        CHECK(bit_equal(one.out, many.out));
        CHECK(bit_equal(one.dq, many.dq));
        CHECK(bit_equal(one.dk, many.dk));
        CHECK(bit_equal(one.dv, many.dv));
      }
      set_num_threads(threads);
      // Only one input requiring grad gives that input's gradient unchanged.
      Tensor lq = q.detach().set_requires_grad(true);
      CHECK(bit_equal(grad({scaled_dot_product_attention(lq, k, v, causal)}, {lq}, {dout})[0], one.dq));
      Tensor lk = k.detach().set_requires_grad(true);
      CHECK(bit_equal(grad({scaled_dot_product_attention(q, lk, v, causal)}, {lk}, {dout})[0], one.dk));
      Tensor lv = v.detach().set_requires_grad(true);
      CHECK(bit_equal(grad({scaled_dot_product_attention(q, k, lv, causal)}, {lv}, {dout})[0], one.dv));
    }
  }
  set_num_threads(threads);
}

TEST_CASE("fused attention: the AVX2 and AVX-512 kernels give the same bits at every thread count",
          "[ops][attention][simd]") {
  const int threads = num_threads();
  const std::vector<Simd> paths = simd_paths();
  // Head dims below, between and above the vector widths; S ragged against
  // the tiles and the 8-row blocks; few heads (the key-tile / query-block
  // schedule at 3 threads) and many.
  for (const Shape& shape : {Shape{1, 2, 150, 44}, Shape{2, 1, 77, 3}, Shape{1, 1, 64, 64},
                             Shape{1, 4, 129, 24}, Shape{1, 1, 9, 17}}) {
    const Tensor q = normal(shape, 1), k = normal(shape, 2), v = normal(shape, 3), dout = normal(shape, 4);
    for (bool causal : {true, false}) {
      set_num_threads(1);
      Result base;
      {
        SimdScope scope(Simd::avx2);
        base = fused(q, k, v, dout, causal);
      }
      for (Simd p : paths)
        for (int t : {1, 3}) {
          INFO("shape " << shape_str(shape) << " causal " << causal << " path " << ops_detail::simd_name(p)
                        << " threads " << t);
          SimdScope scope(p);
          set_num_threads(t);
          const Result r = fused(q, k, v, dout, causal);
          CHECK(same_bits(r.out, base.out));
          CHECK(same_bits(r.dq, base.dq));
          CHECK(same_bits(r.dk, base.dk));
          CHECK(same_bits(r.dv, base.dv));
        }
      set_num_threads(threads);
    }
  }
  set_num_threads(threads);
}

TEST_CASE("the attention kernels' exp: within 1 ulp, fixed edges, the same bits on every path",
          "[ops][attention][simd]") {
  std::vector<float> x;
  for (float t = -86.5f; t <= 88.37f; t += 0.00317f) x.push_back(t);
  for (int n = -124; n <= 127; ++n) x.push_back(float(n * std::log(2.0)));  // near reduction boundaries
  for (float t : {0.0f, -0.0f, 1e-8f, -1e-8f, 0.5f, -0.5f, 1.0f, -1.0f}) x.push_back(t);
  const std::vector<Simd> paths = simd_paths();
  const std::vector<float> y = kernel_exp(x, Simd::avx2);
  double worst_ulp = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(double(x[i]));
    const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
    worst_ulp = std::max(worst_ulp, std::abs(double(y[i]) - want) / ulp);
  }
  INFO("worst error " << worst_ulp << " ulp over " << x.size() << " points");
  CHECK(worst_ulp <= 1.0);
  for (Simd p : paths) {
    INFO("path " << ops_detail::simd_name(p));
    const std::vector<float> z = kernel_exp(x, p);
    CHECK(std::memcmp(z.data(), y.data(), y.size() * sizeof(float)) == 0);
    // Edges: exact 1 at 0; 0 below -86.5 (-inf included); +inf above 88.37; NaN kept.
    const float inf = std::numeric_limits<float>::infinity();
    const std::vector<float> e = kernel_exp({0.0f, -inf, -86.6f, -1000.0f, 88.4f, inf, std::nanf("")}, p);
    CHECK(e[0] == 1.0f);
    CHECK(e[1] == 0.0f);
    CHECK(e[2] == 0.0f);
    CHECK(e[3] == 0.0f);
    CHECK(e[4] == inf);
    CHECK(e[5] == inf);
    CHECK(std::isnan(e[6]));
  }
}

TEST_CASE("fused attention: gradients match finite differences", "[ops][attention][grad]") {
  for (bool causal : {true, false}) {
    check_gradients([causal](auto& t) { return scaled_dot_product_attention(t[0], t[1], t[2], causal); },
                    {normal({1, 2, 5, 4}, 1), normal({1, 2, 5, 4}, 2), normal({1, 2, 5, 4}, 3)});
    check_gradients(
        [causal](auto& t) { return scaled_dot_product_attention(t[0], t[1], t[2], causal, 0.7); },
        {normal({2, 1, 6, 3}, 4), normal({2, 1, 6, 3}, 5), normal({2, 1, 6, 3}, 6)});
  }
  // Non-contiguous inputs, and the same tensor as q, k and v (self-attention).
  check_gradients(
      [](auto& t) {
        return scaled_dot_product_attention(t[0].transpose(1, 2), t[1].transpose(1, 2), t[2].transpose(1, 2));
      },
      {normal({1, 6, 2, 4}, 7), normal({1, 6, 2, 4}, 8), normal({1, 6, 2, 4}, 9)});
  check_gradients([](auto& t) { return scaled_dot_product_attention(t[0], t[0], t[0]); },
                  {normal({1, 1, 7, 4}, 10)});
  // More than one key tile (S = 70 > 64), on a random subset of elements.
  check_gradients([](auto& t) { return scaled_dot_product_attention(t[0], t[1], t[2]); },
                  {normal({1, 1, 70, 2}, 11), normal({1, 1, 70, 2}, 12), normal({1, 1, 70, 2}, 13)});
}

TEST_CASE("fused attention saves q, k, v, out and a [B, H, S] log-sum-exp only; the reference "
          "saves Theta(S^2)", "[ops][attention][memory]") {
  const std::int64_t B = 2, H = 2, D = 8;
  std::vector<std::int64_t> diffs;
  std::int64_t previous_fused = 0;
  for (std::int64_t S : {32, 64, 128}) {
    INFO("S = " << S);
    Tensor q = normal({B, H, S, D}, 1).set_requires_grad(true);
    Tensor k = normal({B, H, S, D}, 2).set_requires_grad(true);
    Tensor v = normal({B, H, S, D}, 3).set_requires_grad(true);
    const std::int64_t operand = B * H * S * D * 4;
    std::int64_t fused_bytes = 0, ref_bytes = 0;
    {
      const std::int64_t live0 = saved_bytes_live();
      const std::int64_t op0 = saved_bytes_report().bytes_by_op[kOp];
      Tensor out = scaled_dot_product_attention(q, k, v);
      fused_bytes = saved_bytes_live() - live0;
      CHECK(saved_bytes_report().bytes_by_op[kOp] - op0 == fused_bytes);
      CHECK(fused_bytes == 4 * operand + 4 * B * H * S);  // q + k + v + out + f32 lse
    }
    {
      const std::int64_t live0 = saved_bytes_live();
      Tensor out = attention_reference(q, k, v);
      ref_bytes = saved_bytes_live() - live0;
      CHECK(ref_bytes >= B * H * S * S * 4);  // at least the probabilities (storages count once)
    }
    if (previous_fused) CHECK(fused_bytes == 2 * previous_fused);  // linear in S
    previous_fused = fused_bytes;
    diffs.push_back(ref_bytes - fused_bytes);
  }
  // Doubling S quadruples what the reference saves beyond the fused op.
  for (std::size_t i = 1; i < diffs.size(); ++i) {
    INFO("saved-bytes difference " << diffs[i - 1] << " -> " << diffs[i]);
    const double ratio = double(diffs[i]) / double(diffs[i - 1]);
    CHECK(ratio > 3.0);
    CHECK(ratio < 5.0);
  }
}

TEST_CASE("attention rejects bad operands with clear messages", "[ops][attention]") {
  const Tensor x = zeros({1, 2, 3, 4});
  CHECK_THROWS_WITH(scaled_dot_product_attention(zeros({2, 3, 4}), zeros({2, 3, 4}), zeros({2, 3, 4})),
                    Catch::Contains("scaled_dot_product_attention: q must be [B, H, S, D], got [2, 3, 4] f32 cpu"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(x, zeros({1, 2, 5, 4}), x),
                    Catch::Contains("k, v one shape [B, Hkv, S, D] with Hkv dividing H (grouped-query attention), "
                                    "got q [1, 2, 3, 4] f32 cpu, k [1, 2, 5, 4] f32 cpu, v [1, 2, 3, 4] f32 cpu"));
  // Grouped-query: 3 key/value heads do not divide 2 query heads; k and v must agree.
  CHECK_THROWS_WITH(scaled_dot_product_attention(x, zeros({1, 3, 3, 4}), zeros({1, 3, 3, 4})),
                    Catch::Contains("with Hkv dividing H"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(x, zeros({1, 1, 3, 4}), x), Catch::Contains("with Hkv dividing H"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(x, x, x.to(DType::bf16)),
                    Catch::Contains("scaled_dot_product_attention: operands have different dtypes"));
  CHECK_THROWS_AS(scaled_dot_product_attention(zeros({1, 2, 3, 4}, DType::i64), x, x), DTypeError);
  CHECK_THROWS_WITH(scaled_dot_product_attention(x, x, x, true, std::nan("")),
                    Catch::Contains("scale must be finite"));
  CHECK_THROWS_WITH(attention_reference(x, zeros({1, 2, 3, 5}), x),
                    Catch::Contains("attention_reference: q must be [B, H, S, D] and k, v one shape"));
}

namespace {
// k or v [B, Hkv, S, D] repeated for every query head of its group: [B, H, S, D].
Tensor repeat_heads(const Tensor& t, std::int64_t group) {
  const std::int64_t B = t.size(0), Hkv = t.size(1), S = t.size(2), D = t.size(3);
  return t.view({B, Hkv, 1, S, D}).expand({B, Hkv, group, S, D}).reshape({B, Hkv * group, S, D});
}
// The sum over each group of query heads, in head order: [B, H, S, D] -> [B, Hkv, S, D].
Tensor sum_heads(const Tensor& t, std::int64_t group) {
  const std::int64_t B = t.size(0), H = t.size(1), S = t.size(2), D = t.size(3);
  const auto x = t.contiguous().to_vector<float>();
  std::vector<float> out(std::size_t(B * (H / group) * S * D), 0.0f);
  const std::int64_t rows = S * D;
  for (std::int64_t h = 0; h < B * H; ++h)
    for (std::int64_t i = 0; i < rows; ++i) out[std::size_t((h / group) * rows + i)] += x[std::size_t(h * rows + i)];
  return from_vector<float>(out, {B, H / group, S, D});
}
}  // namespace

TEST_CASE("grouped-query attention equals attention over repeated key/value heads, bit for bit",
          "[ops][attention]") {
  for (auto [H, Hkv] : {std::pair<std::int64_t, std::int64_t>{4, 2}, {4, 1}, {6, 3}, {8, 2}}) {
    for (std::int64_t S : {5, 64, 131}) {
      for (bool causal : {true, false}) {
        INFO("H " << H << " Hkv " << Hkv << " S " << S << " causal " << causal);
        const std::int64_t group = H / Hkv, D = 16;
        const Tensor q = normal({2, H, S, D}, 11), k = normal({2, Hkv, S, D}, 12), v = normal({2, Hkv, S, D}, 13);
        const Tensor dout = normal({2, H, S, D}, 14);
        const Result g = fused(q, k, v, dout, causal);
        const Result full = fused(q, repeat_heads(k, group).contiguous(), repeat_heads(v, group).contiguous(), dout, causal);
        CHECK(same_bits(g.out, full.out));
        CHECK(same_bits(g.dq, full.dq));
        // The key/value gradients are the per-query-head ones summed over each group in head order.
        CHECK(same_bits(g.dk, sum_heads(full.dk, group)));
        CHECK(same_bits(g.dv, sum_heads(full.dv, group)));
        CHECK(g.dk.sizes() == k.sizes());
        // And the unfused reference agrees (it repeats differentiably).
        const Result r = reference(q, k, v, dout, causal);
        CHECK(scaled_error(g.out, r.out) <= 1e-5);
        CHECK(scaled_error(g.dk, r.dk) <= 1e-5);
        CHECK(scaled_error(g.dv, r.dv) <= 1e-5);
        CHECK(scaled_error(g.dq, r.dq) <= 1e-5);
      }
    }
  }
}

TEST_CASE("grouped-query attention: gradients match finite differences, and it saves only the unrepeated k, v",
          "[ops][attention]") {
  const Tensor q = normal({1, 4, 6, 4}, 21, 0.5), k = normal({1, 2, 6, 4}, 22, 0.5), v = normal({1, 2, 6, 4}, 23);
  check_gradients([](const std::vector<Tensor>& in) { return scaled_dot_product_attention(in[0], in[1], in[2]); },
                  {q, k, v});
  // Saved: q, k, v, out and lse. k and v at their own (Hkv) size.
  Tensor lq = q.detach().set_requires_grad(true), lk = k.detach().set_requires_grad(true),
         lv = v.detach().set_requires_grad(true);
  const std::int64_t before = saved_bytes_report().live_bytes;
  Tensor out = scaled_dot_product_attention(lq, lk, lv);
  const std::int64_t saved = saved_bytes_report().live_bytes - before;
  CHECK(saved == std::int64_t((q.numel() + 2 * k.numel() + out.numel() + 1 * 4 * 6) * 4));
}
