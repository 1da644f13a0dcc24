// Selective save policies: which ops can hand back cached outputs, honest
// skip counts, and version checks of the cached outputs.
#include <catch2/catch.hpp>

#include <set>

#include "checkpoint/checkpoint.h"
#include "checkpoint/plan.h"
#include "engine/autograd.h"
#include "engine/op_hooks.h"
#include "ops/attention.h"
#include "ops/inplace.h"
#include "ops/ops.h"
#include "ops/softmax.h"

using namespace remat;

namespace {

Tensor param(const Shape& s, std::uint64_t seed) {
  Generator g(seed);
  Tensor t = randn(s, DType::f32, &g);
  t.set_requires_grad(true);
  return t;
}

std::vector<float> v(const Tensor& t) { return t.to_vector<float>(); }

// Watches the ops named in `names`, independently of the checkpoint engine:
// it keeps every output they produce outside a replay alive (so no replay
// allocation can reuse its address), and counts, inside replays, the calls
// whose output is one of those storages (the kernel was skipped and the
// forward's result handed back) and those that computed a new one.
struct KernelWatch final : OpHook {
  std::set<std::string> names;
  std::vector<Tensor> forward_outputs;
  std::map<std::string, int> reused, ran;

  explicit KernelWatch(std::set<std::string> n) : names(std::move(n)) {}

  void after(const OpCall& c, const std::vector<Tensor>& outs) override {
    if (!names.count(c.name) || outs.empty()) return;
    if (!in_recompute()) {
      for (const Tensor& t : outs) forward_outputs.push_back(t);
      return;
    }
    bool same = false;
    for (const Tensor& f : forward_outputs) same = same || outs[0].shares_storage_with(f);
    (same ? reused : ran)[c.name]++;
  }
  int total_reused() const {
    int n = 0;
    for (const auto& [k, c] : reused) n += c;
    return n;
  }
};

// A region with four matmuls, a softmax and a fused attention; ends in exp
// (which saves its output), so an early-stopping replay runs every op.
struct AttnBlock {
  Tensor wq = param({8, 8}, 21), wk = param({8, 8}, 22), wv = param({8, 8}, 23), wo = param({8, 8}, 24);
  Tensor operator()(const Tensor& x) const {
    Tensor q = softmax(matmul(x, wq));
    Tensor a = scaled_dot_product_attention(q, matmul(x, wk), matmul(x, wv));
    return exp(mul(matmul(a, wo), 0.1));
  }
  std::vector<Tensor> params() const { return {wq, wk, wv, wo}; }
};

struct Run {
  std::vector<std::vector<float>> grads;
  std::int64_t ops_skipped = 0;
  std::int64_t cache_bytes = 0;  // held as "checkpoint_cache" after the forward
  int reused = 0;
  std::map<std::string, int> ran;
  int ran_of(const std::string& op) const {
    auto it = ran.find(op);
    return it == ran.end() ? 0 : it->second;
  }
};

Run run_attn(const AttnBlock& b, const Tensor& x, const CheckpointOptions* o) {
  for (Tensor p : b.params()) p.set_grad(Tensor());
  auto watch = std::make_shared<KernelWatch>(std::set<std::string>{"matmul", "softmax",
                                                                    "scaled_dot_product_attention"});
  Run r;
  {
    OpHookScope scope(watch);
    reset_checkpoint_counters();
    Tensor y = o ? checkpoint([&b](const Tensor& t) { return b(t); }, x, *o) : b(x);
    const auto rep = saved_bytes_report();
    if (auto it = rep.bytes_by_op.find("checkpoint_cache"); it != rep.bytes_by_op.end()) r.cache_bytes = it->second;
    sum(y).backward();
  }
  for (const Tensor& p : b.params()) r.grads.push_back(v(p.grad()));
  r.ops_skipped = checkpoint_counters().ops_skipped;
  r.reused = watch->total_reused();
  r.ran = watch->ran;
  return r;
}

}  // namespace

TEST_CASE("save_ops takes only ops whose kernels a replay can skip, and says which", "[checkpoint][policy]") {
  CHECK(replay_cacheable_ops() == std::vector<std::string>{"matmul", "scaled_dot_product_attention"});
  CHECK(replay_cacheable("matmul"));
  CHECK(!replay_cacheable("softmax"));
  CHECK_NOTHROW(save_ops({"matmul", "scaled_dot_product_attention"}));
  for (const std::string bad : {"bogus", "softmax", ""}) {
    INFO(bad);
    CHECK_THROWS_AS(save_ops({"matmul", bad}), Error);
    CHECK_THROWS_WITH(save_ops({"matmul", bad}),
                      Catch::Contains("'" + bad + "'") &&
                          Catch::Contains("valid ops: matmul, scaled_dot_product_attention"));
  }
  CHECK_THROWS_WITH(save_ops({}), Catch::Contains("no op names"));

  // The plan parser checks the names the same way.
  CHECK_NOTHROW(RecomputePlan::parse("selective:save_ops=matmul/scaled_dot_product_attention", 2));
  for (const std::string bad : {"bogus", "softmax", "matmul/softmax", "matmul//matmul"}) {
    INFO(bad);
    CHECK_THROWS_WITH(RecomputePlan::parse("selective:save_ops=" + bad, 2),
                      Catch::Contains("--recompute selective:save_ops=" + bad) &&
                          Catch::Contains("cannot hand back cached outputs") &&
                          Catch::Contains("valid ops: matmul, scaled_dot_product_attention"));
  }
}

TEST_CASE("ops_skipped counts the kernels a replay really skipped", "[checkpoint][policy]") {
  AttnBlock b;
  Generator g(5);
  Tensor x = randn({1, 2, 4, 8}, DType::f32, &g);
  const Run plain = run_attn(b, x, nullptr);
  // matmul and attention outputs: what a replay can really hand back.
  const std::int64_t mm_bytes = 4 * 64 * 4, attn_bytes = 64 * 4 + 8 * 4;  // 4 x [1,2,4,8]; out + lse [1,2,4]
  for (bool early : {true, false}) {
    INFO("early_stop " << early);
    // A hand-written policy that also asks for softmax, which cannot skip its
    // kernel: its outputs are not kept and its kernel runs in the replay.
    CheckpointOptions o;
    o.early_stop = early;
    o.policy = [](const std::string& op) {
      return op == "matmul" || op == "softmax" || op == "scaled_dot_product_attention" ? SaveDecision::must_save
                                                                                        : SaveDecision::prefer_recompute;
    };
    const Run r = run_attn(b, x, &o);
    CHECK(r.grads == plain.grads);
    CHECK(r.reused == 5);  // the four matmuls and the attention
    CHECK(r.ran_of("softmax") == 1);
    CHECK(r.ran_of("matmul") == 0);
    CHECK(r.ops_skipped == r.reused);
    CHECK(r.cache_bytes == mm_bytes + attn_bytes);  // nothing kept for softmax

    // The named policies, counted the same way.
    o.policy = save_attention_outputs();
    const Run a = run_attn(b, x, &o);
    CHECK(a.grads == plain.grads);
    CHECK(a.reused == 1);
    CHECK(a.ops_skipped == 1);
    CHECK(a.ran_of("matmul") == 4);
    o.policy = save_matmul_outputs();
    const Run m = run_attn(b, x, &o);
    CHECK(m.grads == plain.grads);
    CHECK(m.reused == 4);
    CHECK(m.ops_skipped == 4);
    CHECK(m.cache_bytes == mm_bytes);
  }
}

TEST_CASE("a cached output modified in place before the replay is an error naming the op", "[checkpoint][policy]") {
  Tensor w = param({8, 8}, 31);
  Generator g(7);
  Tensor x = randn({4, 8}, DType::f32, &g);
  CheckpointOptions o;
  o.name = "block 2";
  o.policy = save_matmul_outputs();
  // The region hands out the matmul's output itself; the caller then writes
  // into it (through a detached alias, which shares its version counter).
  auto fn = [&w](const std::vector<Tensor>& in) {
    Tensor h = matmul(in[0], w);
    return std::vector<Tensor>{h, exp(h)};
  };
  std::vector<Tensor> outs = checkpoint(fn, {x}, o);
  Tensor alias = outs[0].detach();
  mul_(alias, 2.0);
  try {
    sum(outs[1]).backward();
    FAIL("expected AutogradError");
  } catch (const AutogradError& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("checkpoint region 'block 2'"));
    CHECK_THAT(msg, Catch::Contains("op 'matmul' [4, 8] f32"));
    CHECK_THAT(msg, Catch::Contains("modified in place"));
    CHECK_THAT(msg, Catch::Contains("kept at version 0, now version 1"));
  }
  w.set_grad(Tensor());

  // Without the write the same region replays from the cache.
  outs = checkpoint(fn, {x}, o);
  reset_checkpoint_counters();
  sum(outs[1]).backward();
  CHECK(checkpoint_counters().ops_skipped == 1);
}

TEST_CASE("a cached output written in place inside the region's own forward is recomputed", "[checkpoint][policy]") {
  Tensor w = param({8, 8}, 33);
  Generator g(9);
  Tensor x = randn({4, 8}, DType::f32, &g);
  auto body = [&w](const Tensor& t) {
    Tensor h = matmul(t, w);
    Tensor hd = h.detach();
    mul_(hd, 0.5);  // not differentiated through, but the values change
    return exp(h);
  };
  sum(body(x)).backward();
  const auto plain = v(w.grad());
  w.set_grad(Tensor());
  CheckpointOptions o;
  o.policy = save_matmul_outputs();
  Tensor y = checkpoint(body, x, o);
  CHECK(saved_bytes_report().bytes_by_op.count("checkpoint_cache") == 0);  // the stale entry was dropped
  reset_checkpoint_counters();
  sum(y).backward();
  CHECK(checkpoint_counters().ops_skipped == 0);
  CHECK(v(w.grad()) == plain);
}
