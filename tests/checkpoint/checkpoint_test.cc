#include <catch2/catch.hpp>

#include <optional>

#include "checkpoint/checkpoint.h"
#include "checkpoint/replay_memo.h"
#include "engine/autograd.h"
#include "engine/recompute_context.h"
#include "engine/allocator.h"
#include "ops/dropout.h"
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

// A two-layer block with a nonlinearity and (optionally) dropout: enough ops
// that a replay has several saves to regenerate.
struct Block {
  Tensor w1 = param({16, 8}, 1), w2 = param({8, 16}, 2);
  double p = 0.0;
  Tensor operator()(const Tensor& x) const {
    Tensor h = silu(linear(x, w1));
    h = dropout(h, p);
    return add(x, linear(softmax(h), w2));
  }
  void zero() {
    w1.set_grad(Tensor());
    w2.set_grad(Tensor());
  }
};

std::vector<float> v(const Tensor& t) { return t.to_vector<float>(); }

struct Grads {
  std::vector<float> x, w1, w2;
  bool operator==(const Grads&) const = default;
};

// Runs blocks^n on x (optionally checkpointing each) and returns the grads.
Grads run(Block& b, const Tensor& x0, int n, const std::function<Tensor(const Tensor&)>& wrap_block) {
  b.zero();
  Tensor x = x0.detach();
  x.set_requires_grad(true);
  manual_seed(77);
  Tensor h = x;
  for (int i = 0; i < n; ++i) h = wrap_block(h);
  sum(mul(h, h)).backward();
  return Grads{v(x.grad()), v(b.w1.grad()), v(b.w2.grad())};
}

}  // namespace

TEST_CASE("checkpointed gradients equal plain ones bit for bit", "[checkpoint]") {
  Block b;
  b.p = 0.25;  // dropout inside the region: the replay must reuse the same mask
  Generator g(3);
  Tensor x = randn({4, 8}, DType::f32, &g);
  const Grads plain = run(b, x, 3, [&](const Tensor& h) { return b(h); });
  for (bool reentrant : {false, true})
    for (bool early : {true, false}) {
      INFO("reentrant " << reentrant << " early_stop " << early);
      CheckpointOptions o;
      o.reentrant = reentrant;
      o.early_stop = early;
      const Grads ck = run(b, x, 3, [&](const Tensor& h) { return checkpoint([&b](const Tensor& t) { return b(t); }, h, o); });
      CHECK(ck == plain);
    }
  // Nested regions: a region of two blocks, each its own inner region.
  const Grads nested = run(b, x, 1, [&](const Tensor& h) {
    return checkpoint(
        [&b](const Tensor& t) {
          Tensor u = checkpoint([&b](const Tensor& s) { return b(s); }, t);
          Tensor w = checkpoint([&b](const Tensor& s) { return b(s); }, u);
          return b(w);
        },
        h);
  });
  CHECK(nested == plain);
  // Selective policies.
  CheckpointOptions sel;
  sel.policy = save_matmul_outputs();
  reset_checkpoint_counters();
  const Grads s1 = run(b, x, 3, [&](const Tensor& h) { return checkpoint([&b](const Tensor& t) { return b(t); }, h, sel); });
  CHECK(s1 == plain);
  // The first matmul of every block comes from the cache; the replay stops
  // at the second one's saves (its inputs, made before its kernel), so that
  // product is never computed at all.
  CHECK(checkpoint_counters().ops_skipped == 3);
  CHECK(checkpoint_counters().early_stops == 3);
}

TEST_CASE("early stop skips a trailing matmul's product", "[checkpoint]") {
  // A region ending in a wide product (output [4, 4096] f32, 64 KiB): once
  // that product's inputs are saved the replay has everything backward
  // needs, so it stops before the product's kernel allocates the output.
  // Measured by the replay's allocations (category recompute).
  Tensor w1 = param({16, 8}, 1), w2 = param({4096, 16}, 2);
  auto fn = [&](const Tensor& t) { return linear(silu(linear(t, w1)), w2); };
  Generator g(3);
  const Tensor x = randn({4, 8}, DType::f32, &g);
  struct Result {
    std::vector<float> gx, gw1, gw2;
    std::int64_t recompute_peak = 0;
  };
  auto run_once = [&](bool region, bool early) {
    w1.set_grad(Tensor());
    w2.set_grad(Tensor());
    Tensor xl = x.detach();
    xl.set_requires_grad(true);
    CheckpointOptions o;
    o.early_stop = early;
    Tensor y = region ? checkpoint(fn, xl, o) : fn(xl);
    Tensor loss = sum(mul(y, y));
    auto& alloc = allocator_for(kCPU);
    alloc.reset_peak();
    reset_checkpoint_counters();
    loss.backward();
    return Result{v(xl.grad()), v(w1.grad()), v(w2.grad()),
                  alloc.stats().category_peak[std::size_t(MemoryCategory::recompute)]};
  };
  const Result plain = run_once(false, false), early = run_once(true, true);
  CHECK(checkpoint_counters().early_stops == 1);
  const Result full = run_once(true, false);
  CHECK(checkpoint_counters().early_stops == 0);
  for (const Result* r : {&early, &full}) {
    CHECK(r->gx == plain.gx);
    CHECK(r->gw1 == plain.gw1);
    CHECK(r->gw2 == plain.gw2);
  }
  const std::int64_t out_bytes = 4 * 4096 * 4;
  CHECK(plain.recompute_peak == 0);
  CHECK(full.recompute_peak >= out_bytes);  // the whole replay computes the product
  CHECK(early.recompute_peak < out_bytes);  // the early-stopped one never does
}

TEST_CASE("a region keeps only its boundary; backward regenerates and frees everything", "[checkpoint]") {
  Block b;
  Tensor x = param({64, 8}, 5);
  const std::int64_t base = saved_bytes_live();
  Tensor y_plain = b(x);
  const std::int64_t plain_saved = saved_bytes_live() - base;
  y_plain = Tensor();
  CHECK(saved_bytes_live() == base);

  reset_checkpoint_counters();
  Tensor y = checkpoint([&b](const Tensor& t) { return b(t); }, x);
  const auto rep = saved_bytes_report();
  CHECK(rep.live_bytes - base == std::int64_t(x.nbytes()));  // just the boundary input
  CHECK(rep.bytes_by_op.at("checkpoint_boundary") == std::int64_t(x.nbytes()));
  CHECK(plain_saved > 4 * std::int64_t(x.nbytes()));

  // The replay is lazy: when the gradient reaches the region's output only
  // the boundary is held; by the time it reaches the region's input, every
  // regenerated tensor and the boundary itself have been let go.
  std::vector<std::int64_t> at_output, at_input;
  y.register_hook([&](const Tensor&) {
    at_output.push_back(saved_bytes_live() - base);
    return Tensor();
  });
  x.register_hook([&](const Tensor&) {
    at_input.push_back(saved_bytes_live() - base);
    return Tensor();
  });
  sum(y).backward();
  CHECK(at_output == std::vector<std::int64_t>{std::int64_t(x.nbytes())});
  CHECK(at_input == std::vector<std::int64_t>{0});
  CHECK(saved_bytes_live() == base);
  CHECK(checkpoint_counters().replays == 1);
  CHECK(checkpoint_counters().tensors_regenerated > 0);
  // Per-save bytes regenerated cover what the plain forward held (which counts
  // each storage once).
  CHECK(checkpoint_counters().bytes_regenerated >= plain_saved);
}

TEST_CASE("early stop replays fewer ops than the reentrant variant", "[checkpoint]") {
  // Only the first op (exp) saves anything; the two after it save nothing.
  auto fn = [](const Tensor& t) { return mul(add(exp(t), 1.0), 2.0); };
  Tensor x = param({8}, 9);
  CheckpointOptions non, re, no_early;
  re.reentrant = true;
  no_early.early_stop = false;
  std::int64_t ops[3];
  int i = 0;
  for (const auto* o : {&non, &no_early, &re}) {
    reset_checkpoint_counters();
    sum(checkpoint(fn, x, *o)).backward();
    ops[i++] = checkpoint_counters().ops_recomputed;
  }
  CHECK(ops[0] == 1);  // early stop: exp only
  CHECK(ops[1] == 3);  // the whole region
  CHECK(ops[2] == 3);  // reentrant replays the whole region
  CHECK(checkpoint_counters().replays == 1);
}

TEST_CASE("parameters inside a region get gradients even when no input requires grad", "[checkpoint]") {
  for (bool reentrant : {false, true}) {
    Block b;
    Tensor x = randn({4, 8});  // requires no grad
    CheckpointOptions o;
    o.reentrant = reentrant;
    Tensor y = checkpoint([&b](const Tensor& t) { return b(t); }, x, o);
    REQUIRE(y.requires_grad());
    sum(y).backward();
    REQUIRE(b.w1.grad().defined());
    REQUIRE(b.w2.grad().defined());
    const auto g1 = v(b.w1.grad()), g2 = v(b.w2.grad());
    b.zero();
    Tensor y2 = b(x);
    sum(y2).backward();
    // The same gradients as without the region, bit for bit.
    CHECK(g1 == v(b.w1.grad()));
    CHECK(g2 == v(b.w2.grad()));
  }
}

namespace {

// A region with two tensor inputs and three outputs, of a frozen base weight
// with a trainable low-rank adapter beside it (y1 = silu(x W + (x A) B),
// dropped out), a gate on the second input (y2 = y1 * (u V)) and an output
// that depends on no parameter (x + u).
struct AdapterRegion {
  Tensor w = param({16, 8}, 21), a = param({4, 8}, 22), b = param({16, 4}, 23), v = param({16, 8}, 24);
  std::vector<Tensor*> params() { return {&w, &a, &b, &v}; }
  std::vector<Tensor> operator()(const std::vector<Tensor>& in) const {
    const Tensor& x = in[0];
    const Tensor& u = in[1];
    Tensor y1 = dropout(silu(add(linear(x, w), linear(linear(x, a), b))), 0.25);
    return {add(x, u), y1, mul(y1, linear(u, v))};
  }
};

// Gradients of x, u and each parameter (empty where none) after one backward
// of the outputs, with the region checkpointed as `o` (or not at all).
std::vector<std::vector<float>> adapter_grads(AdapterRegion& r, const Tensor& x0, const Tensor& u0, bool x_grad,
                                              const std::optional<CheckpointOptions>& o) {
  for (Tensor* p : r.params()) p->set_grad(Tensor());
  Tensor x = x0.detach(), u = u0.detach();
  if (x_grad) x.set_requires_grad(true);
  manual_seed(5);
  auto fn = [&r](const std::vector<Tensor>& in) { return r(in); };
  const std::vector<Tensor> y = o ? checkpoint(fn, {x, u}, *o) : fn({x, u});
  REQUIRE(y.size() == 3);
  CHECK(y[0].requires_grad() == x_grad);
  add(add(sum(mul(y[1], y[1])), sum(y[2])), sum(y[0])).backward();
  std::vector<std::vector<float>> g;
  for (const Tensor* t : {&x, &u}) g.push_back(t->grad().defined() ? v(t->grad()) : std::vector<float>{});
  for (Tensor* p : r.params()) g.push_back(p->grad().defined() ? v(p->grad()) : std::vector<float>{});
  return g;
}

}  // namespace

TEST_CASE("regions give adapters and inner parameters their exact gradients when no input requires grad",
          "[checkpoint]") {
  // Frozen sets (bits over w, a, b, v): the base weight (the adapter case),
  // base and gate, the adapter itself, none. Each run: no input requiring
  // grad, then x requiring grad; reentrant and not, against the plain run.
  AdapterRegion r;
  Generator g(31);
  const Tensor x = randn({4, 8}, DType::f32, &g), u = randn({4, 8}, DType::f32, &g);
  for (unsigned frozen : {0b0001u, 0b1001u, 0b0110u, 0b0000u})
    for (bool x_grad : {false, true}) {
      const auto params = r.params();
      for (std::size_t i = 0; i < params.size(); ++i) params[i]->set_requires_grad(!(frozen >> i & 1));
      const auto plain = adapter_grads(r, x, u, x_grad, std::nullopt);
      CHECK(plain[0].empty() == !x_grad);
      CHECK(plain[1].empty());  // u never requires grad
      for (std::size_t i = 0; i < params.size(); ++i) CHECK(plain[2 + i].empty() == bool(frozen >> i & 1));
      for (bool reentrant : {false, true}) {
        INFO("frozen " << frozen << " x requires grad " << x_grad << " reentrant " << reentrant);
        CheckpointOptions o;
        o.reentrant = reentrant;
        reset_checkpoint_counters();
        CHECK(adapter_grads(r, x, u, x_grad, o) == plain);  // bit for bit, no gradient where plain has none
        CHECK(checkpoint_counters().replays == 1);          // the region's node ran in backward
      }
    }
  for (Tensor* p : r.params()) p->set_requires_grad(true);
}

TEST_CASE("a reentrant region's backward is a backward, not a recompute", "[checkpoint]") {
  // Gradient hooks (a reducer's, ZeRO's release) fire in the region's own
  // backward after its replay: in_recompute() is false there, as in a plain
  // backward, while the replayed forward runs in a recompute.
  Block b;
  std::vector<bool> forward_in_recompute, post_accumulate_in_recompute;
  b.w1.register_post_accumulate_hook([&](const Tensor&) { post_accumulate_in_recompute.push_back(in_recompute()); });
  CheckpointOptions o;
  o.reentrant = true;
  Tensor y = checkpoint([&](const Tensor& t) {
    forward_in_recompute.push_back(in_recompute());
    return b(t);
  }, randn({4, 8}), o);
  sum(y).backward();
  CHECK(forward_in_recompute == std::vector<bool>{false, true});
  CHECK(post_accumulate_in_recompute == std::vector<bool>{false});
}

TEST_CASE("a reentrant region keeps only its boundary, as a checkpoint_boundary save, and takes no policy",
          "[checkpoint]") {
  Block b;
  Tensor x = param({64, 8}, 5);
  const std::int64_t base = saved_bytes_live();
  CheckpointOptions o;
  o.reentrant = true;
  o.name = "re";
  Tensor y = checkpoint([&b](const Tensor& t) { return b(t); }, x, o);
  const auto rep = saved_bytes_report();
  CHECK(rep.live_bytes - base == std::int64_t(x.nbytes()));  // just the boundary input
  CHECK(rep.bytes_by_op.at("checkpoint_boundary") == std::int64_t(x.nbytes()));
  sum(y).backward();
  CHECK(saved_bytes_live() == base);
  o.policy = save_matmul_outputs();
  CHECK_THROWS_WITH(checkpoint([&b](const Tensor& t) { return b(t); }, x, o),
                    Catch::Contains("checkpoint region 're': a reentrant region takes no selective policy"));
}

TEST_CASE("a tensor leaving a reentrant region beside its outputs is an error when backward reaches it",
          "[checkpoint]") {
  // An auxiliary loss handed out through a capture: the non-reentrant default
  // differentiates it (none's gradients); a reentrant region, whose forward
  // keeps no save, names itself and the cause.
  Block b;
  Generator g(9);
  const Tensor x = randn({4, 8}, DType::f32, &g);
  Tensor side;
  auto fn = [&](const Tensor& t) {
    Tensor h = b(t);
    Tensor aux = sum(mul(h, h));  // (a replay makes it again: the same ops)
    if (!in_recompute()) side = aux;
    return h;
  };
  b.zero();
  add(sum(fn(x)), side).backward();
  const auto plain = v(b.w1.grad());
  for (bool reentrant : {false, true}) {
    INFO("reentrant " << reentrant);
    b.zero();
    CheckpointOptions o;
    o.reentrant = reentrant;
    o.name = "aux";
    Tensor loss = add(sum(checkpoint(fn, x, o)), side);
    if (reentrant) {
      CHECK_THROWS_WITH(loss.backward(), Catch::Contains("reentrant checkpoint region 'aux': backward reached a save") &&
                                             Catch::Contains("left it other than as an output"));
    } else {
      loss.backward();
      CHECK(v(b.w1.grad()) == plain);
    }
  }
}

TEST_CASE("a region without tensor inputs replays from its parameters", "[checkpoint]") {
  // checkpoint(fn, {}): the function reads only parameters and a captured
  // constant; dropout inside makes the replay restore the RNG too.
  Block b;
  b.p = 0.25;
  Generator g(19);
  const Tensor x = randn({4, 8}, DType::f32, &g);
  auto loss_of = [](const Tensor& y) { return sum(mul(y, y)); };
  manual_seed(41);
  loss_of(b(x)).backward();
  const auto g1 = v(b.w1.grad()), g2 = v(b.w2.grad());
  for (bool reentrant : {false, true})
    for (bool early : {true, false}) {
      if (reentrant && !early) continue;
      INFO("reentrant " << reentrant << " early_stop " << early);
      b.zero();
      CheckpointOptions o;
      o.reentrant = reentrant;
      o.early_stop = early;
      reset_checkpoint_counters();
      manual_seed(41);
      std::vector<Tensor> outs = checkpoint(
          [&b, x](const std::vector<Tensor>& in) {
            REQUIRE(in.empty());
            return std::vector<Tensor>{b(x)};
          },
          {}, o);
      REQUIRE(outs.size() == 1);
      REQUIRE(outs[0].requires_grad());
      loss_of(outs[0]).backward();
      CHECK(checkpoint_counters().replays == 1);
      REQUIRE(b.w1.grad().defined());
      CHECK(v(b.w1.grad()) == g1);
      CHECK(v(b.w2.grad()) == g2);
    }
}

TEST_CASE("grad() with explicit inputs works through non-reentrant regions", "[checkpoint]") {
  Block b;
  Tensor x = param({4, 8}, 11);
  Tensor y = checkpoint([&b](const Tensor& t) { return b(t); }, x);
  auto g = grad({sum(y)}, {x, b.w1});
  Tensor y2 = b(x);
  auto g2 = grad({sum(y2)}, {x, b.w1});
  CHECK(v(g[0]) == v(g2[0]));
  CHECK(v(g[1]) == v(g2[1]));
  CHECK(!b.w1.grad().defined());
  CheckpointOptions re;
  re.reentrant = true;
  Tensor y3 = checkpoint([&b](const Tensor& t) { return b(t); }, x, re);
  CHECK_THROWS_WITH(grad({sum(y3)}, {x}), Catch::Contains("cannot run under grad()"));
  // The parameters inside are hidden from grad(): with no input requiring
  // grad, the node is on no path to one, which grad() reports unused.
  Tensor y4 = checkpoint([&b](const Tensor& t) { return b(t); }, x.detach(), re);
  CHECK_THROWS_WITH(grad({sum(y4)}, {b.w1}), Catch::Contains("is not used by the outputs"));
}

TEST_CASE("under no_grad a region just runs its function", "[checkpoint]") {
  Block b;
  reset_checkpoint_counters();
  NoGradGuard ng;
  Tensor y = checkpoint([&b](const Tensor& t) { return b(t); }, randn({2, 8}));
  CHECK(!y.requires_grad());
  CHECK(checkpoint_counters().regions == 0);
}

TEST_CASE("side effects inside a region happen once per forward", "[checkpoint]") {
  int calls = 0, runs = 0;
  auto fn = [&](const Tensor& t) {
    ++runs;
    once([&] { ++calls; });
    CHECK(in_recompute() == (runs > 1));
    return exp(t);
  };
  Tensor x = param({4}, 13);
  sum(checkpoint(fn, x)).backward();
  CHECK(runs == 2);   // forward + replay
  CHECK(calls == 1);  // counted once
  CHECK(!in_recompute());
}

TEST_CASE("a replay that differs from the forward is reported with the region and op", "[checkpoint]") {
  Tensor x = param({4, 4}, 15);
  auto fn = [](const Tensor& t) {
    // Misbehaves: a different shape when replayed.
    return in_recompute() ? sum(exp(t.narrow(0, 0, 2))) : sum(exp(t));
  };
  CheckpointOptions o;
  o.name = "block 3";
  Tensor y = checkpoint(fn, x, o);
  try {
    y.backward();
    FAIL("expected CheckpointMismatchError");
  } catch (const CheckpointMismatchError& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("checkpoint region 'block 3'"));
    CHECK_THAT(msg, Catch::Contains("op 'exp' [2, 4] f32"));
    CHECK_THAT(msg, Catch::Contains("saved op 'exp' [4, 4] f32"));
  }
  // Optional value checksums catch same-shape differences.
  CheckpointOptions c;
  c.checksum = true;
  auto fn2 = [](const Tensor& t) { return in_recompute() ? exp(mul(t, 2.0)) : exp(t); };
  Tensor z = checkpoint(fn2, x, c);
  CHECK_THROWS_WITH(sum(z).backward(), Catch::Contains("different values in the replay"));
}

TEST_CASE("selective policies keep what they name and sit between none and full recompute",
          "[checkpoint]") {
  Block b;
  Tensor x = param({64, 8}, 17);
  const std::int64_t base = saved_bytes_live();
  auto measure = [&](const CheckpointOptions* o) {
    reset_saved_bytes_peak();
    Tensor y = o ? checkpoint([&b](const Tensor& t) { return b(t); }, x, *o) : b(x);
    const std::int64_t held = saved_bytes_live() - base;
    sum(y).backward();
    return held;
  };
  CheckpointOptions full, sel;
  sel.policy = save_matmul_outputs();
  const std::int64_t none_bytes = measure(nullptr);
  const std::int64_t full_bytes = measure(&full);
  const std::int64_t sel_bytes = measure(&sel);
  CHECK(full_bytes < sel_bytes);
  CHECK(sel_bytes < none_bytes);
}

TEST_CASE("replay memos hand the forward's values to replays, nested regions included", "[checkpoint]") {
  // The memo's "computation" counts its calls and returns a fresh value each
  // time: a replay must get the forward's value without calling it.
  int computed = 0;
  auto memo_fn = [&](const Tensor& x) {
    const auto k = replay_memo<std::int64_t>("test", [&] { return std::int64_t(++computed) * 10; });
    return mul(x, double(k));
  };
  Tensor w = param({4}, 7);
  for (bool reentrant : {false, true}) {
    computed = 0;
    const std::int64_t reused0 = replay_memos_reused();
    CheckpointOptions o;
    o.reentrant = reentrant;
    Tensor x = ones({4});
    // Outer region around an inner region: both record; the outer replay
    // re-creates the inner region, which must record the memo from the outer log.
    Tensor y = checkpoint([&](const std::vector<Tensor>& in) {
      Tensor h = exp(mul(in[0], w));
      Tensor inner = checkpoint([&](const Tensor& t) { return exp(memo_fn(t)); }, h, o);
      return std::vector<Tensor>{exp(inner)};
    }, {x}, o)[0];
    CHECK(computed == 1);
    const std::vector<float> fwd = y.to_vector<float>();
    w.set_grad(Tensor());
    sum(y).backward();
    CHECK(computed == 1);  // replays reused the value (10), never recomputed it
    CHECK(replay_memos_reused() - reused0 >= 2);
    // The gradient is the one for k = 10: compare with a plain run with k fixed.
    Tensor g = w.grad().clone();
    w.set_grad(Tensor());
    Tensor h = exp(mul(x, w));
    Tensor plain = exp(exp(mul(h, 10.0)));
    sum(plain).backward();
    CHECK(plain.to_vector<float>() == fwd);
    CHECK(w.grad().to_vector<float>() == g.to_vector<float>());
    w.set_grad(Tensor());
  }
  // Outside any region a memo just computes.
  computed = 0;
  replay_memo<std::int64_t>("test", [&] { return std::int64_t(++computed); });
  replay_memo<std::int64_t>("test", [&] { return std::int64_t(++computed); });
  CHECK(computed == 2);
}
