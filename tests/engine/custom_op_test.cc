// Custom ops (engine/custom_op.h), the public gradcheck, and typed saved-tensor
// hooks composed with checkpoint regions.
#include <catch2/catch.hpp>

#include <cstring>

#include "checkpoint/checkpoint.h"
#include "engine/autograd.h"
#include "engine/custom_op.h"
#include "engine/op_hooks.h"
#include "engine/gradcheck.h"
#include "engine/rng.h"
#include "ops/ops.h"

using namespace remat;

namespace {

Tensor randn_leaf(const Shape& s, std::uint64_t seed) {
  Generator g(seed);
  Tensor t = randn(s, DType::f32, &g);
  t.set_requires_grad(true);
  return t;
}

// y = tanh(a) * b * scale, and a non-differentiable mask (y > 0) as i64.
// Saves tanh(a) (an intermediate) and b (an input).
const CustomOp& tanh_mul() {
  static const CustomOp op(
      "tanh_mul",
      [](CustomOpContext& ctx, const std::vector<Tensor>& in) {
        const double scale = 1.5;
        Tensor t = tanh(in[0]);
        Tensor y = mul(mul(t, in[1]), scale);
        Tensor mask = cast(relu(y) * 1e30, DType::i64);
        ctx.save_for_backward({t, in[1]});
        ctx.set("scale", scale);
        ctx.mark_non_differentiable({mask});
        return std::vector<Tensor>{y, mask};
      },
      [](CustomOpContext& ctx, const std::vector<Tensor>& g) {
        const auto saved = ctx.saved_tensors();
        const Tensor &t = saved[0], &b = saved[1];
        const double scale = ctx.get<double>("scale");
        Tensor gy = mul(g[0], scale);
        Tensor ga, gb;
        if (ctx.needs_input_grad(0)) ga = mul(mul(gy, b), rsub(mul(t, t), 1.0));
        if (ctx.needs_input_grad(1)) gb = mul(gy, t);
        return std::vector<Tensor>{ga, gb};
      });
  return op;
}

std::vector<float> vals(const Tensor& t) { return t.contiguous().to_vector<float>(); }

bool same_bits(const Tensor& a, const Tensor& b) {
  const auto x = vals(a), y = vals(b);
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("custom op: forward, non-differentiable outputs, gradcheck", "[custom_op]") {
  Tensor a = randn_leaf({3, 4}, 1), b = randn_leaf({3, 4}, 2);
  auto out = tanh_mul()({a, b});
  REQUIRE(out.size() == 2);
  CHECK(out[0].requires_grad());
  CHECK(std::string(out[0].grad_fn()->name()) == "tanh_mul");
  CHECK(!out[1].requires_grad());
  CHECK(out[1].dtype() == DType::i64);
  // Values equal the same chain of built-in ops.
  Tensor ref = mul(mul(tanh(a), b), 1.5);
  CHECK(same_bits(out[0], ref));

  const GradcheckResult r = gradcheck([](const std::vector<Tensor>& in) { return tanh_mul()(in)[0]; },
                                      {a.detach(), b.detach()});
  INFO(r.report());
  CHECK(r.ok);
  CHECK(r.checked == 2 * (12 + 1));

  // Only b needs a gradient: a's stays undefined.
  Tensor a2 = a.detach();
  Tensor b2 = randn_leaf({3, 4}, 2);
  sum(tanh_mul()({a2, b2})[0]).backward();
  CHECK(b2.grad().defined());
  CHECK(!a2.grad().defined());
}

TEST_CASE("gradcheck reports a wrong backward", "[custom_op]") {
  const CustomOp wrong("wrong_square",
                       [](CustomOpContext& ctx, const std::vector<Tensor>& in) {
                         ctx.save_for_backward({in[0]});
                         return std::vector<Tensor>{mul(in[0], in[0])};
                       },
                       [](CustomOpContext& ctx, const std::vector<Tensor>& g) {
                         return std::vector<Tensor>{mul(g[0], ctx.saved_tensors()[0])};  // missing the factor 2
                       });
  const GradcheckResult r =
      gradcheck([&](const std::vector<Tensor>& in) { return wrong.apply1(in); }, {randn_leaf({5}, 3).detach()});
  CHECK(!r.ok);
  CHECK(r.failures.size() == 6);  // every element and the directional derivative
  CHECK_THAT(r.report(), Catch::Contains("input 0 [5] element 0: numeric"));
}

TEST_CASE("custom op inside a checkpoint region is replayed, bit-identical", "[custom_op][checkpoint]") {
  auto run = [](bool region, bool reentrant) {
    Tensor a = randn_leaf({4, 6}, 11), b = randn_leaf({4, 6}, 12), w = randn_leaf({6, 6}, 13);
    auto body = [&](const std::vector<Tensor>& in) {
      Tensor h = matmul(in[0], w);
      return std::vector<Tensor>{tanh_mul()({h, in[1]})[0]};
    };
    reset_checkpoint_counters();
    Tensor y;
    if (region) {
      CheckpointOptions o;
      o.reentrant = reentrant;
      y = checkpoint(body, {a, b}, o)[0];
    } else {
      y = body({a, b})[0];
    }
    if (region && !reentrant) CHECK(saved_bytes_report().bytes_by_op.count("tanh_mul") == 0);
    sum(mul(y, y)).backward();
    const auto c = checkpoint_counters();
    CHECK(c.replays == (region ? 1 : 0));
    if (region && !reentrant) CHECK(c.tensors_regenerated >= 2);  // tanh_mul's two saves (and matmul's)
    return std::vector<Tensor>{a.grad(), b.grad(), w.grad()};
  };
  const auto plain = run(false, false);
  for (bool reentrant : {false, true}) {
    INFO("reentrant " << reentrant);
    const auto ck = run(true, reentrant);
    for (std::size_t i = 0; i < plain.size(); ++i) CHECK(same_bits(plain[i], ck[i]));
  }
}

TEST_CASE("custom op goes through dispatch and the saved-bytes registry by name", "[custom_op]") {
  struct Names : OpHook {
    std::vector<std::string> seen;
    std::optional<std::vector<Tensor>> before(const OpCall& c) override {
      seen.emplace_back(c.name);
      return std::nullopt;
    }
  };
  auto names = std::make_shared<Names>();
  Tensor a = randn_leaf({2, 3}, 4), b = randn_leaf({2, 3}, 5);
  Tensor y;
  {
    OpHookScope scope(names);
    y = tanh_mul()({a, b})[0];
  }
  REQUIRE(!names->seen.empty());
  CHECK(names->seen.front() == "tanh_mul");
  // Two f32 [2, 3] saves: tanh(a) and b.
  CHECK(saved_bytes_report().bytes_by_op.at("tanh_mul") == 2 * 6 * 4);
  sum(y).backward();
}

TEST_CASE("custom op errors name the op", "[custom_op]") {
  auto fwd = [](CustomOpContext&, const std::vector<Tensor>& in) { return std::vector<Tensor>{mul(in[0], 2.0)}; };
  Tensor a = randn_leaf({3}, 6);
  SECTION("wrong number of gradients") {
    const CustomOp op("two_grads", fwd, [](CustomOpContext&, const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0], g[0]};
    });
    CHECK_THROWS_WITH(sum(op.apply1({a})).backward(),
                      Catch::Contains("custom op 'two_grads': backward returned 2 gradients for 1 inputs"));
  }
  SECTION("gradient of the wrong dtype") {
    const CustomOp op("bf16_grad", fwd, [](CustomOpContext&, const std::vector<Tensor>& g) {
      return std::vector<Tensor>{cast(g[0], DType::bf16)};
    });
    CHECK_THROWS_WITH(sum(op.apply1({a})).backward(),
                      Catch::Contains("custom op 'bf16_grad': backward returned a gradient of shape [3] bf16") &&
                          Catch::Contains("for input 0, which is [3] f32"));
  }
  SECTION("missing context value") {
    const CustomOp op("no_value", fwd, [](CustomOpContext& ctx, const std::vector<Tensor>& g) {
      return std::vector<Tensor>{mul(g[0], ctx.get<double>("scale"))};
    });
    CHECK_THROWS_WITH(sum(op.apply1({a})).backward(),
                      Catch::Contains("custom op 'no_value': no context value 'scale' was set in forward"));
  }
  SECTION("saved input modified in place") {
    const CustomOp op(
        "saves_input",
        [](CustomOpContext& ctx, const std::vector<Tensor>& in) {
          ctx.save_for_backward({in[0]});
          return std::vector<Tensor>{mul(in[0], in[0])};
        },
        [](CustomOpContext& ctx, const std::vector<Tensor>& g) {
          return std::vector<Tensor>{mul(mul(g[0], ctx.saved_tensors()[0]), 2.0)};
        });
    Tensor x = mul(a, 1.0);
    Tensor y = op.apply1({x});
    {
      NoGradGuard ng;
      x.fill_(0.0);
    }
    CHECK_THROWS_WITH(sum(y).backward(), Catch::Contains("saved by op 'saves_input'") &&
                                             Catch::Contains("was modified in place afterwards"));
  }
  SECTION("construction") {
    CHECK_THROWS_WITH(CustomOp("", fwd, fwd), Catch::Contains("needs a name"));
    CHECK_THROWS_WITH(CustomOp("x", fwd, nullptr), Catch::Contains("CustomOp 'x': backward function is missing"));
  }
}

// ---------------------------------------------------------------------------
// Typed hooks

namespace {

// Keeps a copy of every tensor in a box (as offload would keep a host copy);
// counts what it packs.
struct BoxHooks : TypedSavedTensorHooks {
  struct Box {
    Tensor copy;
  };
  int packed = 0, unpacked = 0;
  std::any pack_tensor(const Tensor& t, const SaveInfo&) override {
    ++packed;
    return Box{t.clone()};
  }
  Tensor unpack_tensor(std::any p, const SaveInfo&) override {
    ++unpacked;
    return std::any_cast<Box&>(p).copy;
  }
};

}  // namespace

TEST_CASE("a typed hook outside a checkpoint region composes without special cases", "[hooks][checkpoint]") {
  auto run = [](std::shared_ptr<BoxHooks> hooks) {
    Tensor x = randn_leaf({4, 8}, 21), w1 = randn_leaf({8, 8}, 22), w2 = randn_leaf({8, 8}, 23);
    Tensor loss;
    {
      std::optional<SavedTensorHooksScope> scope;
      if (hooks) scope.emplace(hooks);
      Tensor h = matmul(x, w1);  // outside the region: the hook packs its saves
      h = checkpoint([&](const Tensor& t) { return tanh(matmul(t, w2)); }, h);
      loss = sum(mul(h, h));
    }
    loss.backward();
    return std::vector<Tensor>{x.grad(), w1.grad(), w2.grad()};
  };
  const auto plain = run(nullptr);
  auto hooks = std::make_shared<BoxHooks>();
  const auto boxed = run(hooks);
  for (std::size_t i = 0; i < plain.size(); ++i) CHECK(same_bits(plain[i], boxed[i]));
  // It packed the saves made outside the region (matmul x w1, mul h h, the
  // region boundary's are the engine's own) and never saw a placeholder.
  CHECK(hooks->packed >= 3);
  CHECK(hooks->unpacked == hooks->packed);
}

TEST_CASE("a hook that returns the wrong type gets an error naming hook, op and save", "[hooks]") {
  struct Untyped : SavedTensorHooks {
    std::string name() const override { return "my-untyped-hook"; }
    std::any pack(std::any v, const SaveInfo&) override { return std::any_cast<Tensor>(v).clone(); }
    std::any unpack(std::any p, const SaveInfo&) override { return p; }
  };
  struct WrongShape : TypedSavedTensorHooks {
    std::any pack_tensor(const Tensor& t, const SaveInfo&) override { return t; }
    Tensor unpack_tensor(std::any p, const SaveInfo&) override { return std::any_cast<Tensor>(p).view({-1}); }
  };
  struct WrongValue : SavedTensorHooks {
    std::any pack(std::any v, const SaveInfo&) override { return v; }
    std::any unpack(std::any, const SaveInfo&) override { return 42; }
  };
  Tensor w = randn_leaf({3, 3}, 31), x = randn_leaf({2, 3}, 32);
  SECTION("an untyped hook casting a checkpoint placeholder") {
    SavedTensorHooksScope scope(std::make_shared<Untyped>());
    CHECK_THROWS_WITH(checkpoint([&](const Tensor& t) { return matmul(t, w); }, x),
                      Catch::Contains("saved-tensor hook 'my-untyped-hook' failed on save #") &&
                          Catch::Contains("of op 'matmul' (shape [2, 3] f32, checkpoint region") &&
                          Catch::Contains("TypedSavedTensorHooks"));
  }
  SECTION("a typed hook unpacking another shape") {
    Tensor y;
    {
      SavedTensorHooksScope scope(std::make_shared<WrongShape>());
      y = matmul(x, w);
    }
    CHECK_THROWS_WITH(sum(y).backward(), Catch::Contains("::WrongShape' unpacked save #") &&
                                             Catch::Contains("of op 'matmul' (shape [3, 3] f32) to a Tensor of shape "
                                                             "[9] f32, expected the Tensor it packed (shape [3, 3] "
                                                             "f32)"));
  }
  SECTION("an untyped hook unpacking a non-tensor") {
    Tensor y;
    {
      SavedTensorHooksScope scope(std::make_shared<WrongValue>());
      y = matmul(x, w);
    }
    CHECK_THROWS_WITH(sum(y).backward(), Catch::Contains("of op 'matmul'") && Catch::Contains("to a value of type int"));
  }
}
