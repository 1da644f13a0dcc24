#include "tools/bench_ops.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>

#include "engine/autograd.h"
#include "engine/parallel_for.h"
#include "ops/attention.h"
#include "ops/gemm.h"
#include "ops/loss.h"
#include "ops/norm.h"
#include "ops/ops.h"
#include "ops/softmax.h"
#include "ops/swiglu.h"
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

}  // namespace

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
  std::printf("%-44s %10s %12s\n", "case", "median ms", "throughput");

  auto report = [&](const std::string& kind, const std::string& name, const std::string& backend,
                    const Timing& t, double work, const char* unit) {
    const double rate = work / (t.median_ms * 1e-3) / 1e9;
    std::printf("%-44s %10.3f %8.1f %s\n", (name + (backend.empty() ? "" : " [" + backend + "]")).c_str(),
                t.median_ms, rate, unit);
    JsonObject o;
    o.set("kind", kind).set("case", name).set("backend", backend).set("median_ms", t.median_ms);
    o.set("min_ms", t.min_ms).set("max_ms", t.max_ms).set(unit, rate);
    rows.push_back(o);
  };

  // Shapes of bench-dense (d 512, ffn 1376, vocab 256, batch 4 x seq 256 =
  // 1024 tokens, 8 heads of 64).
  const std::int64_t T = 1024, d = 512, ffn = 1376, V = 256, B = 4, H = 8, S = 256, Dh = 64;
  struct GemmCase {
    const char* name;
    std::int64_t m, n, k;
    bool trans_a, trans_b;
  };
  const GemmCase gemms[] = {
      {"q/k/v/o proj   [1024x512]@[512x512]^T", T, d, d, false, true},
      {"gate/up proj   [1024x512]@[1376x512]^T", T, ffn, d, false, true},
      {"down proj      [1024x1376]@[512x1376]^T", T, d, ffn, false, true},
      {"down dX        [1024x512]@[512x1376]", T, ffn, d, false, false},
      {"up dW          [1024x1376]^T@[1024x512]", ffn, d, T, true, false},
      {"lm head        [1024x512]@[256x512]^T", T, V, d, false, true},
  };
  for (auto backend : {ops_detail::GemmBackend::openblas, ops_detail::GemmBackend::eigen}) {
    ops_detail::set_gemm_backend(backend);
    const char* bname = backend == ops_detail::GemmBackend::openblas ? "openblas" : "eigen";
    for (const auto& g : gemms) {
      Tensor a = rnd(g.trans_a ? Shape{g.k, g.m} : Shape{g.m, g.k}, 1);
      Tensor b = rnd(g.trans_b ? Shape{g.n, g.k} : Shape{g.k, g.n}, 2);
      Tensor aa = g.trans_a ? a.t() : a, bb = g.trans_b ? b.t() : b;
      Timing t = time_it([&] { matmul(aa, bb); }, 2, repeats);
      report("gemm", g.name, bname, t, 2.0 * double(g.m) * double(g.n) * double(g.k), "GFLOP/s");
    }
  }
  ops_detail::set_gemm_backend(ops_detail::GemmBackend::openblas);
  {
    Tensor q = rnd({B * H, S, Dh}, 3), k = rnd({B * H, S, Dh}, 4);
    Timing t = time_it([&] { bmm(q, k.transpose(1, 2)); }, 2, repeats);
    report("gemm", "attn scores bmm [32x256x64]@[32x64x256]", "per-batch", t,
           2.0 * double(B * H) * double(S) * double(S) * double(Dh), "GFLOP/s");
  }

  // Memory-bound ops: bytes read + written per call.
  const std::int64_t N = T * ffn;
  Tensor x = rnd({T, ffn}, 5), y = rnd({T, ffn}, 6);
  auto mem = [&](const char* name, double bytes, const std::function<void()>& fn) {
    report("memory", name, "", time_it(fn, 2, repeats), bytes, "GB/s");
  };
  const double f = 4.0;
  mem("add            [1024x1376]", 3 * f * double(N), [&] { add(x, y); });
  mem("mul            [1024x1376]", 3 * f * double(N), [&] { mul(x, y); });
  mem("exp            [1024x1376]", 2 * f * double(N), [&] { exp(x); });
  mem("silu           [1024x1376]", 2 * f * double(N), [&] { silu(x); });
  mem("swiglu         [1024x1376]", 3 * f * double(N), [&] { swiglu(x, y); });
  mem("sum rows       [1024x1376]", f * double(N), [&] { sum(x, {1}); });
  Tensor hs = rnd({T, d}, 7), w = ones({d});
  mem("rms_norm       [1024x512]", 2 * f * double(T * d), [&] { rms_norm(hs, w); });
  // The residual add + RMSNorm of a decoder block, fused and as the two ops.
  // Both rows count the fused op's traffic (x and residual read, h and y
  // written; backward reads grad_h, grad_y and h, writes dx = dresidual), so
  // their GB/s compare directly. fwd+bwd records the graph and runs grad()
  // for x, residual and weight.
  {
    Tensor ar = rnd({T, d}, 14), ga = rnd({T, d}, 15), gb = rnd({T, d}, 16);
    const double fwd_bytes = 4 * f * double(T * d), fb_bytes = 8 * f * double(T * d);
    mem("add_rms_norm   [1024x512]", fwd_bytes, [&] { add_rms_norm(hs, ar, w); });
    mem("add+rms_norm (unfused) [1024x512]", fwd_bytes, [&] { rms_norm(add(hs, ar), w); });
    Tensor xl = hs.detach(), rl = ar.detach(), wl = w.detach();
    xl.set_requires_grad(true);
    rl.set_requires_grad(true);
    wl.set_requires_grad(true);
    mem("add_rms_norm fwd+bwd [1024x512]", fb_bytes, [&] {
      EnableGradGuard eg;
      const AddRmsNorm o = add_rms_norm(xl, rl, wl);
      grad({o.h, o.y}, {xl, rl, wl}, {ga, gb});
    });
    mem("add+rms_norm fwd+bwd (unfused) [1024x512]", fb_bytes, [&] {
      EnableGradGuard eg;
      const Tensor h = add(xl, rl);
      grad({h, rms_norm(h, wl)}, {xl, rl, wl}, {ga, gb});
    });
  }
  Tensor sc = rnd({B * H * S, S}, 8);
  mem("softmax        [8192x256]", 2 * f * double(B * H * S * S), [&] { softmax(sc); });
  Tensor logits = rnd({T, 8192}, 9);
  Tensor targets = arange(T);
  mem("cross_entropy  [1024x8192]", f * double(T * 8192), [&] { cross_entropy(logits, targets); });

  // Fused causal attention: forward, backward alone (the graph kept, grad()
  // of q, k, v) and both. FLOPs are the causal half of the products: 2 in the
  // forward (Q K^T, P V), 5 in the backward (Q K^T again, dO V^T, dS K,
  // P^T dO, dS^T Q). REMAT_SIMD=avx2 times the AVX2 kernels on an AVX-512 CPU.
  {
    Tensor q = rnd({B, H, S, Dh}, 10), k = rnd({B, H, S, Dh}, 11), v = rnd({B, H, S, Dh}, 12);
    const double fwd_flops = 4.0 * double(B * H) * double(S) * double(S) * double(Dh) / 2.0;
    report("attention", "sdpa forward   [4x8x256x64] causal", "fused",
           time_it([&] { scaled_dot_product_attention(q, k, v); }, 1, repeats), fwd_flops, "GFLOP/s");
    Tensor ql = q.detach(), kl = k.detach(), vl = v.detach();
    ql.set_requires_grad(true);
    kl.set_requires_grad(true);
    vl.set_requires_grad(true);
    Tensor go = rnd({B, H, S, Dh}, 13);
    {
      EnableGradGuard eg;
      Tensor o = scaled_dot_product_attention(ql, kl, vl);
      report("attention", "sdpa backward  [4x8x256x64] causal", "fused",
             time_it([&] { grad({o}, {ql, kl, vl}, {go}, /*retain_graph=*/true); }, 1, repeats),
             fwd_flops * 2.5, "GFLOP/s");
    }
    report("attention", "sdpa fwd+bwd   [4x8x256x64] causal", "fused", time_it([&] {
             EnableGradGuard eg;
             Tensor o = scaled_dot_product_attention(ql, kl, vl);
             backward({o}, {go});
           }, 1, repeats),
           fwd_flops * 3.5, "GFLOP/s");
  }

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
