#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/op_hooks.h"
#include "ops/ops.h"

using namespace remat;

namespace {
Tensor leaf(std::vector<float> v, Shape s) {
  Tensor t = from_vector<float>(v, s);
  t.set_requires_grad(true);
  return t;
}
std::vector<float> vals(const Tensor& t) { return t.to_vector<float>(); }

// Records pack/unpack calls into a shared log; packs by wrapping the value.
struct LoggingHooks : SavedTensorHooks {
  LoggingHooks(std::string name, std::vector<std::string>* log) : name(std::move(name)), log(log) {}
  std::any pack(std::any value, const SaveInfo& info) override {
    log->push_back(name + ".pack(" + info.op + ")");
    return std::make_pair(name, std::move(value));
  }
  std::any unpack(std::any packed, const SaveInfo& info) override {
    auto p = std::any_cast<std::pair<std::string, std::any>>(std::move(packed));
    REQUIRE(p.first == name);  // an outer hook unwraps its own layer first
    log->push_back(name + ".unpack(" + info.op + ")");
    return std::move(p.second);
  }
  std::size_t held_bytes(const std::any&) const override { return 0; }
  std::string name;
  std::vector<std::string>* log;
};
}  // namespace

TEST_CASE("backward computes and accumulates leaf gradients", "[autograd]") {
  Tensor a = leaf({1, 2, 3}, {3});
  Tensor b = leaf({4, 5, 6}, {3});
  Tensor y = sum(a * b + a);  // dy/da = b + 1, dy/db = a
  CHECK(y.requires_grad());
  CHECK(!y.is_leaf());
  CHECK(std::string(y.grad_fn()->name()) == "sum");
  y.backward();
  CHECK(vals(a.grad()) == std::vector<float>{5, 6, 7});
  CHECK(vals(b.grad()) == std::vector<float>{1, 2, 3});
  // A second graph accumulates into the same .grad.
  sum(a * 2.0).backward();
  CHECK(vals(a.grad()) == std::vector<float>{7, 8, 9});
  // Gradients live in the gradient memory category.
  CHECK(allocator_for(kCPU).stats().category(MemoryCategory::gradient) > 0);
}

TEST_CASE("seed gradients and non-scalar outputs", "[autograd]") {
  Tensor a = leaf({1, 2}, {2});
  Tensor y = a * 3.0;
  CHECK_THROWS_WITH(y.backward(), Catch::Contains("a seed gradient is required"));
  y.backward(from_vector<float>({1, 10}));
  CHECK(vals(a.grad()) == std::vector<float>{3, 30});
  CHECK_THROWS_WITH(y.backward(from_vector<float>({1, 2, 3})), Catch::Contains("seed gradient of shape [3]"));
}

TEST_CASE("saved tensors are freed by backward unless the graph is retained", "[autograd]") {
  const std::int64_t base = saved_bytes_live();
  Tensor a = leaf({1, 2, 3, 4}, {4});
  Tensor b = leaf({5, 6, 7, 8}, {4});
  Tensor y = sum(exp(a * b));
  const auto during = saved_bytes_report();
  CHECK(during.live_bytes - base == 16 * 3);  // mul saves a and b, exp saves its output
  CHECK(during.bytes_by_op.at("mul") >= 32);
  CHECK(during.bytes_by_op.at("exp") >= 16);
  y.backward({}, /*retain_graph=*/true);
  CHECK(saved_bytes_live() - base == 48);
  const auto g1 = vals(a.grad());
  y.backward();  // works again: the graph was retained
  CHECK(saved_bytes_live() == base);
  const auto g2 = vals(a.grad());
  for (std::size_t i = 0; i < g1.size(); ++i) CHECK(g2[i] == Approx(2 * g1[i]));
  // A third backward through the freed graph is a clear error.
  CHECK_THROWS_AS(y.backward(), AutogradError);
  CHECK_THROWS_WITH(y.backward(), Catch::Contains("a second time") && Catch::Contains("retain_graph"));
}

TEST_CASE("memory falls during backward: each node frees its saves after running", "[autograd]") {
  const std::int64_t base = saved_bytes_live();
  Tensor x = leaf(std::vector<float>(1024, 0.5f), {1024});
  Tensor h1 = exp(x);     // saves 4 KiB (its output)
  Tensor mid = h1 * 2.0;  // saves nothing
  Tensor h2 = exp(mid);   // saves 4 KiB
  Tensor h3 = exp(h2);    // saves 4 KiB
  std::int64_t seen_at_mid = -1;
  mid.register_hook([&](const Tensor&) {
    seen_at_mid = saved_bytes_live() - base;
    return Tensor();
  });
  CHECK(saved_bytes_live() - base == 3 * 4096);
  sum(h3).backward();
  // When the gradient reached `mid`, the two exps after it had released theirs.
  CHECK(seen_at_mid == 4096);
  CHECK(saved_bytes_live() == base);
}

TEST_CASE("an in-place write to a saved tensor is detected at backward", "[autograd]") {
  Tensor a = leaf({1, 2, 3}, {3});
  Tensor b = from_vector<float>({4, 5, 6});  // does not require grad; saved for a's gradient
  Tensor y = sum(a * b);
  b.fill_(0.0);
  try {
    y.backward();
    FAIL("expected AutogradError");
  } catch (const AutogradError& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("shape [3]"));
    CHECK_THAT(msg, Catch::Contains("saved by op 'mul'"));
    CHECK_THAT(msg, Catch::Contains("saved at version 0, now version 1"));
  }
  // In-place writes to tensors that require grad are refused up front.
  CHECK_THROWS_WITH(a.fill_(1.0), Catch::Contains("fill_: in-place write to a tensor of shape [3] that requires grad"));
  {
    NoGradGuard ng;
    CHECK_NOTHROW(a.detach().fill_(1.0));
  }
}

TEST_CASE("saved-tensor hooks compose: inner packs first, outer unpacks first", "[autograd][hooks]") {
  std::vector<std::string> log;
  Tensor a = leaf({1, 2}, {2});
  Tensor y;
  {
    SavedTensorHooksScope outer(std::make_shared<LoggingHooks>("outer", &log));
    SavedTensorHooksScope inner(std::make_shared<LoggingHooks>("inner", &log));
    y = sum(exp(a));  // exp saves its output
  }
  CHECK(log == std::vector<std::string>{"inner.pack(exp)", "outer.pack(exp)"});
  y.backward();
  CHECK(log == std::vector<std::string>{"inner.pack(exp)", "outer.pack(exp)", "outer.unpack(exp)",
                                        "inner.unpack(exp)"});
  CHECK(a.grad().at({1}) == Approx(std::exp(2.0)));
  // Saves outside the scopes are not packed.
  log.clear();
  sum(exp(a)).backward();
  CHECK(log.empty());
}

TEST_CASE("hooks see the SaveInfo; held bytes follow what the hook keeps", "[autograd][hooks]") {
  struct DropToCpuCopy : SavedTensorHooks {
    std::vector<SaveInfo> seen;
    std::any pack(std::any value, const SaveInfo& info) override {
      seen.push_back(info);
      return std::any_cast<Tensor>(value).clone();  // keeps a copy: held bytes = tensor bytes
    }
    std::any unpack(std::any packed, const SaveInfo&) override { return packed; }
  };
  auto hooks = std::make_shared<DropToCpuCopy>();
  Tensor a = leaf(std::vector<float>(8, 1.0f), {2, 4});
  Tensor b = leaf(std::vector<float>(8, 2.0f), {2, 4});
  const std::int64_t base = saved_bytes_live();
  Tensor y;
  {
    SavedTensorHooksScope scope(hooks);
    RegionScope region(7);
    y = sum(a * b);
  }
  REQUIRE(hooks->seen.size() == 2);
  CHECK(std::string(hooks->seen[0].op) == "mul");
  CHECK(hooks->seen[0].bytes == 32);
  CHECK(hooks->seen[0].meta.sizes == Shape{2, 4});
  CHECK(hooks->seen[0].region == 7);
  CHECK(!hooks->seen[0].is_output);
  CHECK(saved_bytes_report().bytes_by_region.at(7) == 64);
  CHECK(saved_bytes_live() - base == 64);
  y.backward();
  CHECK(vals(a.grad()) == std::vector<float>(8, 2.0f));
}

TEST_CASE("grad() returns gradients for explicit inputs without touching .grad", "[autograd]") {
  Tensor a = leaf({1, 2}, {2});
  Tensor b = leaf({3, 4}, {2});
  Tensor c = leaf({5, 6}, {2});
  Tensor h = a * b;
  Tensor y = sum(h * h);  // dy/dh = 2h, dy/da = 2 h b
  auto g = grad({y}, {a, h}, {}, /*retain_graph=*/true);
  CHECK(vals(g[0]) == std::vector<float>{18, 64});
  CHECK(vals(g[1]) == std::vector<float>{6, 16});
  CHECK(!a.grad().defined());
  CHECK(!b.grad().defined());
  CHECK_THROWS_WITH(grad({y}, {c}, {}, true), Catch::Contains("is not used by the outputs"));
  auto u = grad({y}, {c, b}, {}, false, /*allow_unused=*/true);
  CHECK(!u[0].defined());
  CHECK(vals(u[1]) == std::vector<float>{2 * 3 * 1, 2 * 8 * 2});
}

TEST_CASE("no_grad, enable_grad, detach and requires_grad rules", "[autograd]") {
  Tensor a = leaf({1, 2}, {2});
  {
    NoGradGuard ng;
    Tensor y = a * 2.0;
    CHECK(!y.requires_grad());
    {
      EnableGradGuard eg;
      CHECK((a * 2.0).requires_grad());
    }
    CHECK(!grad_enabled());
  }
  CHECK(grad_enabled());
  Tensor d = (a * 2.0).detach();
  CHECK(!d.requires_grad());
  CHECK(d.is_leaf());
  Tensor i = zeros({2}, DType::i64);
  CHECK_THROWS_AS(i.set_requires_grad(true), DTypeError);
  CHECK_THROWS_WITH(i.set_requires_grad(true), Catch::Contains("only floating tensors"));
  CHECK_THROWS_WITH((a * 2.0).set_requires_grad(false), Catch::Contains("only leaves"));
  Tensor plain = from_vector<float>({1, 2});
  CHECK_THROWS_WITH(plain.backward(), Catch::Contains("does not require grad"));
}

TEST_CASE("gradient hooks on leaves and intermediates", "[autograd]") {
  Tensor a = leaf({1, 2}, {2});
  Tensor h = a * 3.0;
  std::vector<float> seen;
  h.register_hook([&](const Tensor& g) {
    seen = vals(g);
    return g * 10.0;  // replaces the gradient flowing on
  });
  a.register_hook([](const Tensor& g) { return g + 1.0; });
  sum(h * h).backward();  // d/dh = 2h = {6, 12}; then x10, x3, +1
  CHECK(seen == std::vector<float>{6, 12});
  CHECK(vals(a.grad()) == std::vector<float>{181, 361});
}

TEST_CASE("views are differentiable", "[autograd]") {
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor y = sum(x.t().narrow(0, 1, 2) * from_vector<float>({1, 2}, {1, 2})) +
             sum(x.select(1, 0).unsqueeze(1).expand({2, 4})) + sum(x.view({3, 2}).slice(0, 0, 3, 2));
  y.backward();
  // t().narrow(0, 1, 2) is [[x01, x11], [x02, x12]] weighted by column (1, 2);
  // select(1, 0) is column 0 (x00, x10) used 4 times; view({3, 2}).slice takes
  // rows 0 and 2 of the flat order: x00, x01, x11, x12.
  CHECK(vals(x.grad()) == std::vector<float>{4 + 1, 1 + 1, 1, 4, 2 + 1, 2 + 1});
}

TEST_CASE("the dispatch point lets hooks observe and intercept ops", "[autograd][dispatch]") {
  struct Recorder : OpHook {
    std::vector<std::string> names;
    void after(const OpCall& call, const std::vector<Tensor>&) override { names.push_back(call.name); }
  };
  struct ReplaceExp : OpHook {
    std::optional<std::vector<Tensor>> before(const OpCall& call) override {
      if (std::string(call.name) == "exp") return std::vector<Tensor>{full(call.inputs[0].sizes(), 42.0)};
      return std::nullopt;
    }
  };
  auto rec = std::make_shared<Recorder>();
  const auto ops0 = ops_called();
  {
    OpHookScope s1(rec);
    OpHookScope s2(std::make_shared<ReplaceExp>());
    Tensor y = exp(from_vector<float>({1, 2})) + 1.0;
    CHECK(vals(y) == std::vector<float>{43, 43});
  }
  CHECK(rec->names == std::vector<std::string>{"exp", "add_scalar"});
  CHECK(ops_called() - ops0 == 2);
}

TEST_CASE("backward runs newest node first and counts nodes", "[autograd]") {
  Tensor a = leaf({1, 2}, {2});
  const auto c0 = autograd_counters();
  Tensor y = sum(exp(a) * a);
  const auto c1 = autograd_counters();
  CHECK(c1.nodes_created - c0.nodes_created == 4);  // exp, mul, sum and a's AccumulateGrad
  y.backward();
  const auto c2 = autograd_counters();
  CHECK(c2.nodes_run - c1.nodes_run == 4);  // sum, mul, exp, and a's AccumulateGrad
  // d/da (e^a a) = e^a (1 + a)
  CHECK(a.grad().at({0}) == Approx(std::exp(1.0) * 2));
}

TEST_CASE("a gradient placement receives a leaf's first gradient, later ones add into it", "[autograd]") {
  Tensor a = leaf({1, 2}, {2});
  Tensor b = leaf({3, 4, 5}, {3});
  Tensor flat = zeros({6});  // a: [0, 2), b: [2, 5), one padding element
  flat.narrow(0, 5, 1).fill_(-7.0);
  a.set_grad_placement([&](const Tensor&) { return flat.narrow(0, 0, 2); });
  b.set_grad_placement([&](const Tensor&) { return flat.narrow(0, 2, 3); });
  sum(a * a).backward();
  sum(b * 3.0).backward();
  CHECK(a.grad().shares_storage_with(flat));
  CHECK(vals(flat) == std::vector<float>{2, 4, 3, 3, 3, -7});
  sum(a * 2.0).backward();  // accumulates in place
  CHECK(vals(flat) == std::vector<float>{4, 6, 3, 3, 3, -7});
  // An undefined placement falls back to a fresh copy; a wrong shape is an error.
  Tensor c = leaf({1}, {1});
  c.set_grad_placement([](const Tensor&) { return Tensor(); });
  sum(c * 2.0).backward();
  CHECK(c.grad().item() == 2.0);
  Tensor d = leaf({1, 2}, {2});
  d.set_grad_placement([&](const Tensor&) { return flat.narrow(0, 0, 3); });
  CHECK_THROWS_WITH(sum(d).backward(), Catch::Contains("gradient placement") && Catch::Contains("[3]"));
}

TEST_CASE("a gradient the engine holds alone is summed into; a caller's or a hook's never is", "[autograd][memory]") {
  // y has two consumers: the second gradient adds into the first one's buffer
  // when nothing else holds it, with the same values as a sum into a copy,
  // and no third buffer of y's size (a sum into a copy needs one).
  constexpr std::int64_t n = 256 * 1024;
  const std::int64_t bytes = n * 4;
  Tensor x = ones({n});
  x.set_requires_grad(true);
  Tensor y = x * 2.0;
  Tensor u = y * 3.0, v = y * 5.0;
  y = Tensor();
  const Tensor seed_u = ones({n}), seed_v = ones({n});
  CachingAllocator& cpu = allocator_for(kCPU);
  const std::int64_t before = cpu.stats().allocated_bytes;
  cpu.reset_peak();
  // u's and v's gradients, then their sum in y's slot, then x's gradient.
  backward({u, v}, {seed_u, seed_v});
  const std::int64_t peak = cpu.stats().allocated_peak - before;
  INFO("peak during backward " << peak << " bytes, y is " << bytes);
  CHECK(peak < 2 * bytes + bytes / 2);
  CHECK(vals(x.grad()) == std::vector<float>(std::size_t(n), 16.0f));

  // Seeds the caller holds: the same output seeded twice sums into a copy,
  // and the caller's seeds keep their values.
  Tensor z = leaf({1, 2}, {2});
  Tensor w = z * 1.0;
  const Tensor s1 = from_vector<float>({1, 2}, {2}), s2 = from_vector<float>({10, 20}, {2});
  backward({w, w}, {s1, s2});
  CHECK(vals(z.grad()) == std::vector<float>{11, 22});
  CHECK(vals(s1) == std::vector<float>{1, 2});
  CHECK(vals(s2) == std::vector<float>{10, 20});

  // A hook keeps the gradient of a view of b; the view's backward hands b a
  // view of that same storage as b's first gradient, and c's gradient comes
  // second: it is summed into a copy, and what the hook kept is not written.
  Tensor a = leaf({1, 2}, {2});
  Tensor b = a * 1.0;
  Tensor c = b * 3.0;
  Tensor h = b.reshape({2, 1});
  Tensor kept;
  h.register_hook([&](const Tensor& g) {
    kept = g;
    return Tensor();
  });
  (sum(h * 2.0) + sum(c)).backward();
  CHECK(vals(kept) == std::vector<float>{2, 2});
  CHECK(vals(a.grad()) == std::vector<float>{5, 5});
}

TEST_CASE("a narrow's gradient adds into its region of the input's gradient buffer", "[autograd][memory]") {
  // Eight row blocks of y, each scaled by its own factor: backward writes the
  // first block's gradient into a zero-filled buffer of y's shape and adds
  // the others into their rows of it, so one such buffer is live at a time.
  constexpr std::int64_t rows = 2048, cols = 64, parts = 8, per = rows / parts;
  const std::int64_t bytes = rows * cols * 4;
  Tensor x = ones({rows, cols});
  x.set_requires_grad(true);
  Tensor y = x * 1.0;
  std::vector<Tensor> outs;
  for (std::int64_t p = 0; p < parts; ++p) outs.push_back(y.narrow(0, p * per, per) * double(p + 1));
  Tensor loss = sum(cat(outs, 0));
  outs.clear();
  y = Tensor();
  CachingAllocator& cpu = allocator_for(kCPU);
  const std::int64_t before = cpu.stats().allocated_bytes;
  cpu.reset_peak();
  loss.backward();
  // Live at the peak: two gradients of y's size and a block's (2.13x y's
  // bytes). A zero-filled buffer per narrow added another whole one (3.13x).
  const std::int64_t peak = cpu.stats().allocated_peak - before;
  INFO("peak during backward " << peak << " bytes, y is " << bytes);
  CHECK(peak < 2 * bytes + bytes / 2);
  const auto g = vals(x.grad());
  for (std::int64_t r = 0; r < rows; r += per / 2) CHECK(g[std::size_t(r * cols)] == float(r / per + 1));
}
