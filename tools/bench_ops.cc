#include "tools/bench_ops.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>

#include "engine/autograd.h"
#include "engine/op_def.h"
#include "engine/op_hooks.h"
#include "engine/parallel_for.h"
#include "moe/dispatch.h"
#include "ops/gemm.h"
#include "ops/ops.h"
#include "parallel/vocab_parallel.h"
#include "tools/args.h"
#include "tools/json.h"

namespace remat::tools {

namespace {

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
};

Timing time_it(const std::function<void()>& fn, int warmup, int repeats) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return Timing{ms[ms.size() / 2], ms.front(), ms.back()};
}

Tensor rnd(const Shape& s, std::uint64_t seed) {
  Generator g(seed);
  return randn(s, DType::f32, &g);
}

// A leaf copy of t that requires grad.
Tensor leaf(const Tensor& t) { return t.detach().set_requires_grad(); }

// Shapes of bench-dense (d 512, ffn 1376, vocab 256, batch 4 x seq 256 =
// 1024 tokens, 8 heads of 64).
constexpr std::int64_t T = 1024, d = 512, ffn = 1376, V = 256, B = 4, H = 8, S = 256, Dh = 64;

// The op costs (engine/op_def.h) of the calls of `op` one run of fn makes.
OpCost cost_of(const std::string& op, const std::function<void()>& fn) {
  struct Sum final : OpHook {
    explicit Sum(std::string o) : op(std::move(o)) {}
    void after(const OpCall& c, const std::vector<Tensor>&) override {
      if (c.op && op == c.name) {
        const OpCost k = c.op->cost(c);
        total.matmul_flops += k.matmul_flops;
        total.vector_flops += k.vector_flops;
        total.bytes += k.bytes;
      }
    }
    std::string op;
    OpCost total;
  };
  auto sum = std::make_shared<Sum>(op);
  {
    OpHookScope scope(sum);
    fn();
  }
  return sum->total;
}

// GEMMs through matmul, on both CPU back ends, and the attention scores' bmm.
void add_gemm_cases(std::vector<BenchOpCase>& c) {
  struct GemmShape {
    const char* name;
    std::int64_t m, n, k;
    bool trans_a, trans_b;
  };
  const GemmShape gemms[] = {
      {"q/k/v/o proj   [1024x512]@[512x512]^T", T, d, d, false, true},
      {"gate/up proj   [1024x512]@[1376x512]^T", T, ffn, d, false, true},
      {"down proj      [1024x1376]@[512x1376]^T", T, d, ffn, false, true},
      {"down dX        [1024x512]@[512x1376]", T, ffn, d, false, false},
      {"up dW          [1024x1376]^T@[1024x512]", ffn, d, T, true, false},
      {"lm head        [1024x512]@[256x512]^T", T, V, d, false, true},
  };
  for (auto backend : {ops_detail::GemmBackend::blis, ops_detail::GemmBackend::openblas, ops_detail::GemmBackend::eigen}) {
    const char* bname = ops_detail::gemm_backend_name(backend);
    for (const GemmShape& g : gemms)
      c.push_back({"gemm", g.name, "matmul", bname, [g, backend] {
                     ops_detail::set_gemm_backend(backend);
                     Tensor a = rnd(g.trans_a ? Shape{g.k, g.m} : Shape{g.m, g.k}, 1);
                     Tensor b = rnd(g.trans_b ? Shape{g.n, g.k} : Shape{g.k, g.n}, 2);
                     Tensor aa = g.trans_a ? a.t() : a, bb = g.trans_b ? b.t() : b;
                     return std::function<void()>([aa, bb] { matmul(aa, bb); });
                   }});
  }
  c.push_back({"gemm", "attn scores bmm [32x256x64]@[32x64x256]", "matmul", "per-batch", [] {
                 ops_detail::set_gemm_backend(ops_detail::default_gemm_backend());
                 Tensor q = rnd({B * H, S, Dh}, 3), k = rnd({B * H, S, Dh}, 4);
                 return std::function<void()>([q, k] { bmm(q, k.transpose(1, 2)); });
               }});
}

// Memory-bound elementwise, reduction and shape ops at the MLP's width, then
// the in-place ones.
void add_elementwise_cases(std::vector<BenchOpCase>& c) {
  auto xy = [] { return std::pair{rnd({T, ffn}, 5), rnd({T, ffn}, 6)}; };
  auto mem = [&](const char* name, const char* op, std::function<void(const Tensor&, const Tensor&)> fn) {
    c.push_back({"memory", name, op, "", [xy, fn] {
                   auto [x, y] = xy();
                   return std::function<void()>([x, y, fn] { fn(x, y); });
                 }});
  };
  mem("add            [1024x1376]", "add", [](const Tensor& x, const Tensor& y) { add(x, y); });
  mem("sub            [1024x1376]", "sub", [](const Tensor& x, const Tensor& y) { sub(x, y); });
  mem("mul            [1024x1376]", "mul", [](const Tensor& x, const Tensor& y) { mul(x, y); });
  mem("div            [1024x1376]", "div", [](const Tensor& x, const Tensor& y) { div(x, y); });
  mem("add_scalar     [1024x1376]", "add_scalar", [](const Tensor& x, const Tensor&) { add(x, 1.0); });
  mem("mul_scalar     [1024x1376]", "mul_scalar", [](const Tensor& x, const Tensor&) { mul(x, 0.5); });
  mem("rsub_scalar    [1024x1376]", "rsub_scalar", [](const Tensor& x, const Tensor&) { rsub(x, 1.0); });
  mem("neg            [1024x1376]", "neg", [](const Tensor& x, const Tensor&) { neg(x); });
  mem("exp            [1024x1376]", "exp", [](const Tensor& x, const Tensor&) { exp(x); });
  mem("log            [1024x1376]", "log", [](const Tensor& x, const Tensor&) { log(x); });
  mem("sqrt           [1024x1376]", "sqrt", [](const Tensor& x, const Tensor&) { sqrt(x); });
  mem("rsqrt          [1024x1376]", "rsqrt", [](const Tensor& x, const Tensor&) { rsqrt(x); });
  mem("pow            [1024x1376]", "pow", [](const Tensor& x, const Tensor&) { pow(x, 3.0); });
  mem("abs            [1024x1376]", "abs", [](const Tensor& x, const Tensor&) { abs(x); });
  mem("relu           [1024x1376]", "relu", [](const Tensor& x, const Tensor&) { relu(x); });
  mem("gelu           [1024x1376]", "gelu", [](const Tensor& x, const Tensor&) { gelu(x); });
  mem("silu           [1024x1376]", "silu", [](const Tensor& x, const Tensor&) { silu(x); });
  mem("sigmoid        [1024x1376]", "sigmoid", [](const Tensor& x, const Tensor&) { sigmoid(x); });
  mem("tanh           [1024x1376]", "tanh", [](const Tensor& x, const Tensor&) { tanh(x); });
  mem("swiglu         [1024x1376]", "swiglu", [](const Tensor& x, const Tensor& y) { swiglu(x, y); });
  mem("sum rows       [1024x1376]", "sum", [](const Tensor& x, const Tensor&) { sum(x, {1}); });
  mem("mean rows      [1024x1376]", "mean", [](const Tensor& x, const Tensor&) { mean(x, {1}); });
  mem("max rows       [1024x1376]", "max", [](const Tensor& x, const Tensor&) { max(x, 1); });
  mem("topk 8 of rows [1024x1376]", "topk", [](const Tensor& x, const Tensor&) { topk(x, 8); });
  mem("cast to bf16   [1024x1376]", "cast", [](const Tensor& x, const Tensor&) { cast(x, DType::bf16); });
  mem("cat rows       [2048x1376]", "cat", [](const Tensor& x, const Tensor& y) { cat({x, y}, 0); });
  mem("split rows     [1024x1376]", "split", [](const Tensor& x, const Tensor&) { split(x, 256, 0); });
  mem("dropout 0.1    [1024x1376]", "dropout", [](const Tensor& x, const Tensor&) { dropout(x, 0.1); });
  auto inplace = [&](const char* name, const char* op, std::function<void(Tensor&, const Tensor&)> fn) {
    c.push_back({"memory", name, op, "", [xy, fn] {
                   auto [x, y] = xy();
                   return std::function<void()>([x, y, fn]() mutable { fn(x, y); });
                 }});
  };
  inplace("add_           [1024x1376]", "add_", [](Tensor& x, const Tensor& y) { add_(x, y, 1e-3); });
  inplace("mul_           [1024x1376]", "mul_", [](Tensor& x, const Tensor& y) { mul_(x, y); });
  inplace("mul_scalar_    [1024x1376]", "mul_scalar_", [](Tensor& x, const Tensor&) { mul_(x, 1.0); });
  inplace("zero_          [1024x1376]", "zero_", [](Tensor& x, const Tensor&) { zero_(x); });
  inplace("copy_          [1024x1376]", "copy_", [](Tensor& x, const Tensor& y) { copy_(x, y); });
}

// Normalisations at the residual stream's width, the fused residual add +
// RMSNorm against its two ops.
void add_norm_cases(std::vector<BenchOpCase>& c) {
  c.push_back({"memory", "rms_norm       [1024x512]", "rms_norm", "", [] {
                 Tensor hs = rnd({T, d}, 7), w = ones({d});
                 return std::function<void()>([hs, w] { rms_norm(hs, w); });
               }});
  c.push_back({"memory", "layer_norm     [1024x512]", "layer_norm", "", [] {
                 Tensor hs = rnd({T, d}, 7), w = ones({d}), b = zeros({d});
                 return std::function<void()>([hs, w, b] { layer_norm(hs, w, b); });
               }});
  // The residual add + RMSNorm of a decoder block, fused and as the two ops.
  // All four rows count the fused op's traffic (x and residual read, h and y
  // written; backward reads grad_h, grad_y and h, writes dx = dresidual), so
  // their GB/s compare directly. fwd+bwd records the graph and runs grad()
  // for x, residual and weight.
  const double f = 4.0, fwd_bytes = 4 * f * double(T * d), fb_bytes = 8 * f * double(T * d);
  auto norm_inputs = [] { return std::tuple{rnd({T, d}, 7), rnd({T, d}, 14), ones({d})}; };
  c.push_back({"memory", "add_rms_norm   [1024x512]", "add_rms_norm", "", [norm_inputs] {
                 auto [hs, ar, w] = norm_inputs();
                 return std::function<void()>([hs, ar, w] { add_rms_norm(hs, ar, w); });
               }, fwd_bytes});
  c.push_back({"memory", "add+rms_norm (unfused) [1024x512]", "rms_norm", "", [norm_inputs] {
                 auto [hs, ar, w] = norm_inputs();
                 return std::function<void()>([hs, ar, w] { rms_norm(add(hs, ar), w); });
               }, fwd_bytes});
  c.push_back({"memory", "add_rms_norm fwd+bwd [1024x512]", "add_rms_norm", "", [norm_inputs] {
                 auto [hs, ar, w] = norm_inputs();
                 Tensor xl = leaf(hs), rl = leaf(ar), wl = leaf(w), ga = rnd({T, d}, 15), gb = rnd({T, d}, 16);
                 return std::function<void()>([=] {
                   EnableGradGuard eg;
                   const AddRmsNorm o = add_rms_norm(xl, rl, wl);
                   grad({o.h, o.y}, {xl, rl, wl}, {ga, gb});
                 });
               }, fb_bytes});
  c.push_back({"memory", "add+rms_norm fwd+bwd (unfused) [1024x512]", "rms_norm", "", [norm_inputs] {
                 auto [hs, ar, w] = norm_inputs();
                 Tensor xl = leaf(hs), rl = leaf(ar), wl = leaf(w), ga = rnd({T, d}, 15), gb = rnd({T, d}, 16);
                 return std::function<void()>([=] {
                   EnableGradGuard eg;
                   const Tensor h = add(xl, rl);
                   grad({h, rms_norm(h, wl)}, {xl, rl, wl}, {ga, gb});
                 });
               }, fb_bytes});
}

// Softmaxes over attention scores, the loss over a large vocabulary, rotary.
void add_softmax_loss_cases(std::vector<BenchOpCase>& c) {
  c.push_back({"memory", "softmax        [8192x256]", "softmax", "", [] {
                 Tensor sc = rnd({B * H * S, S}, 8);
                 return std::function<void()>([sc] { softmax(sc); });
               }});
  c.push_back({"memory", "log_softmax    [8192x256]", "log_softmax", "", [] {
                 Tensor sc = rnd({B * H * S, S}, 8);
                 return std::function<void()>([sc] { log_softmax(sc); });
               }});
  c.push_back({"memory", "cross_entropy  [1024x8192]", "cross_entropy", "", [] {
                 Tensor logits = rnd({T, 8192}, 9), targets = arange(T);
                 return std::function<void()>([logits, targets] { cross_entropy(logits, targets); });
               }});
  // The head and its loss at once, 256 rows a time: the logits never whole.
  c.push_back({"gemm", "linear_cross_entropy [1024x512]@[8192x512]^T, chunk 256", "linear_cross_entropy", "", [] {
                 Tensor h = rnd({T, d}, 11), w = rnd({8192, d}, 12), targets = arange(T);
                 return std::function<void()>([h, w, targets] { linear_cross_entropy(h, w, targets, 256); });
               }});
  // The same on one rank of a tensor-parallel group (its vocabulary rows; the
  // collectives are a one-process group's).
  c.push_back({"gemm", "vocab_parallel_cross_entropy [1024x512]@[8192x512]^T, one rank", "vocab_parallel_cross_entropy",
               "", [] {
                 Tensor h = rnd({T, d}, 11), w = rnd({8192, d}, 12), targets = arange(T);
                 return std::function<void()>([h, w, targets] {
                   vocab_parallel_cross_entropy(single_process_group(), h, w, targets, 0, 8192, T);
                 });
               }});
  c.push_back({"memory", "rotary         [4x8x256x64]", "rotary_embedding", "", [] {
                 Tensor q = rnd({B, H, S, Dh}, 10);
                 return std::function<void()>([q] { rotary_embedding(q); });
               }});
}

// Row movement: embeddings, indexing, an MoE block's dispatch and combine.
void add_row_movement_cases(std::vector<BenchOpCase>& c) {
  c.push_back({"memory", "embedding      [256x512] ids [1024]", "embedding", "", [] {
                 Tensor w = rnd({V, d}, 17), ids = remainder_ids(T, V);
                 return std::function<void()>([w, ids] { embedding(w, ids); });
               }});
  c.push_back({"memory", "index_select   [1024x512] rows [1024]", "index_select", "", [] {
                 Tensor x = rnd({T, d}, 18), ids = remainder_ids(T, T);
                 return std::function<void()>([x, ids] { index_select(x, 0, ids); });
               }});
  c.push_back({"memory", "index_add      [1024x512] rows [1024]", "index_add", "", [] {
                 Tensor x = rnd({T, d}, 18), src = rnd({T, d}, 19), ids = remainder_ids(T, T);
                 return std::function<void()>([x, src, ids] { index_add(x, 0, ids, src); });
               }});
  c.push_back({"memory", "gather         [1024x512] 64 per row", "gather", "", [] {
                 Tensor x = rnd({T, d}, 18), ids = remainder_ids(T * 64, d).view({T, 64});
                 return std::function<void()>([x, ids] { gather(x, 1, ids); });
               }});
  c.push_back({"memory", "scatter_add    [1024x512] 64 per row", "scatter_add", "", [] {
                 Tensor x = rnd({T, d}, 18), src = rnd({T, 64}, 20), ids = remainder_ids(T * 64, d).view({T, 64});
                 return std::function<void()>([x, src, ids] { scatter_add(x, 1, ids, src); });
               }});
  auto moe_routing = [] {
    // 1024 tokens, top 2 of 8 experts, every slot kept.
    return std::make_shared<Routing>(make_routing(remainder_ids(T * 2, 8).view({T, 2}), 8, 0.0));
  };
  c.push_back({"memory", "moe_dispatch   [1024x512] top 2 of 8", "moe_dispatch", "", [moe_routing] {
                 Tensor x = rnd({T, d}, 21);
                 auto r = moe_routing();
                 return std::function<void()>([x, r] { moe_dispatch_rows(x, *r, false); });
               }});
  c.push_back({"memory", "moe_combine    [2048x512] top 2 of 8", "moe_combine", "", [moe_routing] {
                 Tensor y = rnd({2 * T, d}, 22), w = ones({2 * T});
                 auto r = moe_routing();
                 return std::function<void()>([y, w, r] { moe_combine_rows(y, w, *r); });
               }});
}

// Fused causal attention: forward, backward alone (the graph kept, grad()
// of q, k, v) and both. FLOPs are the causal half of the products: 2 in the
// forward (Q K^T, P V), 5 in the backward (Q K^T again, dO V^T, dS K,
// P^T dO, dS^T Q). REMAT_SIMD=avx2 times the AVX2 kernels on an AVX-512 CPU.
void add_attention_cases(std::vector<BenchOpCase>& c) {
  const double fwd_flops = 4.0 * double(B * H) * double(S) * double(S) * double(Dh) / 2.0;
  auto qkv = [] { return std::tuple{rnd({B, H, S, Dh}, 10), rnd({B, H, S, Dh}, 11), rnd({B, H, S, Dh}, 12)}; };
  c.push_back({"attention", "sdpa forward   [4x8x256x64] causal", "scaled_dot_product_attention", "fused", [qkv] {
                 auto [q, k, v] = qkv();
                 return std::function<void()>([q, k, v] { scaled_dot_product_attention(q, k, v); });
               }, fwd_flops, 1});
  c.push_back({"attention", "sdpa backward  [4x8x256x64] causal", "scaled_dot_product_attention", "fused", [qkv] {
                 auto [q, k, v] = qkv();
                 Tensor ql = leaf(q), kl = leaf(k), vl = leaf(v), go = rnd({B, H, S, Dh}, 13);
                 EnableGradGuard eg;
                 Tensor o = scaled_dot_product_attention(ql, kl, vl);
                 return std::function<void()>([=] { grad({o}, {ql, kl, vl}, {go}, /*retain_graph=*/true); });
               }, fwd_flops * 2.5, 1});
  c.push_back({"attention", "sdpa fwd+bwd   [4x8x256x64] causal", "scaled_dot_product_attention", "fused", [qkv] {
                 auto [q, k, v] = qkv();
                 Tensor ql = leaf(q), kl = leaf(k), vl = leaf(v), go = rnd({B, H, S, Dh}, 13);
                 return std::function<void()>([=] {
                   EnableGradGuard eg;
                   Tensor o = scaled_dot_product_attention(ql, kl, vl);
                   backward({o}, {go});
                 });
               }, fwd_flops * 3.5, 1});
}

// The cases. `work` (FLOPs or bytes per call) is given where the row's
// figure is defined by hand (the causal half of attention, the fused
// add_rms_norm's traffic for both of its rows); otherwise it is the op's own
// cost for one call: matrix-product FLOPs (GFLOP/s) for products, bytes
// (GB/s) for everything else.
std::vector<BenchOpCase> make_cases() {
  std::vector<BenchOpCase> c;
  add_gemm_cases(c);
  add_elementwise_cases(c);
  add_norm_cases(c);
  add_softmax_loss_cases(c);
  add_row_movement_cases(c);
  add_attention_cases(c);
  return c;
}

}  // namespace

// ids[i] = (i * 7919) mod n: a spread of every value below n.
Tensor remainder_ids(std::int64_t count, std::int64_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) v[std::size_t(i)] = (i * 7919) % n;
  return from_vector<std::int64_t>(v, {count});
}

const std::vector<BenchOpCase>& bench_op_cases() {
  static const std::vector<BenchOpCase> cases = make_cases();
  return cases;
}

int run_bench_ops(const std::vector<std::string>& args) {
  Flags flags("bench-ops", "GFLOP/s and GB/s of the CPU kernels at transformer shapes", args,
              {threads_flag_spec(),
               int_flag("repeats", "timed repeats per case; the median is reported", 9, {.min = 1, .max = 1000000}),
               text_flag("json", "write the results as a JSON array to FILE")});
  apply_threads_flag(flags);
  const int repeats = int(flags.get_int("repeats"));
  NoGradGuard ng;

  std::vector<JsonObject> rows;
  std::printf("remat bench-ops: %d threads, median of %d repeats\n\n", num_threads(), repeats);
  std::printf("%-44s %-30s %10s %12s\n", "case", "op", "median ms", "throughput");
  for (const BenchOpCase& c : bench_op_cases()) {
    const std::function<void()> fn = c.setup();
    const Timing t = time_it(fn, c.warmup, repeats);
    double work = c.work;
    const bool flops = c.kind != "memory";
    if (work <= 0) {
      const OpCost k = cost_of(c.op, fn);
      work = flops ? k.matmul_flops : k.bytes;
    }
    const char* unit = flops ? "GFLOP/s" : "GB/s";
    const double rate = work / (t.median_ms * 1e-3) / 1e9;
    std::printf("%-44s %-30s %10.3f %8.1f %s\n", (c.name + (c.backend.empty() ? "" : " [" + c.backend + "]")).c_str(),
                c.op.c_str(), t.median_ms, rate, unit);
    JsonObject o;
    o.set("kind", c.kind).set("case", c.name).set("op", c.op).set("backend", c.backend).set("median_ms", t.median_ms);
    o.set("min_ms", t.min_ms).set("max_ms", t.max_ms).set(unit, rate);
    rows.push_back(o);
  }
  ops_detail::set_gemm_backend(ops_detail::default_gemm_backend());

  if (flags.has("json")) {
    const std::string path = flags.get("json");
    std::ofstream out(path);
    REMAT_CHECK(out.good(), IOError, "bench-ops: cannot write ", path);
    out << json_array(rows);
    std::printf("\nwrote %s\n", path.c_str());
  }
  return 0;
}

}  // namespace remat::tools
