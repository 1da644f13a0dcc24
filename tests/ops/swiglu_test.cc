#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "engine/parallel_for.h"
#include "ops/ops.h"
#include "ops/swiglu.h"
#include "tests/ops/gradcheck.h"

using namespace remat;
using namespace remat::testing;

TEST_CASE("swiglu matches silu(gate) * up", "[ops][swiglu]") {
  const Tensor gate = normal({3, 7}, 1, 3.0), up = normal({3, 7}, 2);
  auto check_ref = [](const Tensor& y, const Tensor& g, const Tensor& u) {
    const auto yv = y.to(DType::f32).to_vector<float>();
    const auto gv = g.contiguous().to(DType::f32).to_vector<float>();
    const auto uv = u.contiguous().to(DType::f32).to_vector<float>();
    REQUIRE(yv.size() == gv.size());
    for (std::size_t i = 0; i < yv.size(); ++i) {
      const double gi = gv[i];
      CHECK(yv[i] == Approx(gi / (1 + std::exp(-gi)) * uv[i]).margin(1e-6).epsilon(1e-5));
    }
  };
  Tensor y = swiglu(gate, up);
  CHECK(y.sizes() == gate.sizes());
  check_ref(y, gate, up);
  check_ref(swiglu(gate.t(), up.t()), gate.t(), up.t());  // non-contiguous
  // Large |gate| stays finite: silu(-100) = 0, silu(100) = 100.
  CHECK(swiglu(from_vector<float>({-100, 100}), from_vector<float>({2, 2})).to_vector<float>() ==
        std::vector<float>{-0.0f, 200.0f});
  Tensor h = swiglu(gate.to(DType::bf16), up.to(DType::bf16));
  CHECK(h.dtype() == DType::bf16);
  const auto hv = h.to(DType::f32).to_vector<float>();
  const auto ref = (silu(gate.to(DType::bf16).to(DType::f32)) * up.to(DType::bf16).to(DType::f32))
                       .to_vector<float>();
  for (std::size_t i = 0; i < hv.size(); ++i) CHECK(hv[i] == Approx(ref[i]).margin(1e-2).epsilon(1e-2));
  // Rounded once: the bits of the f32 op on the same values, rounded to bf16.
  CHECK(hv == swiglu(gate.to(DType::bf16).to(DType::f32), up.to(DType::bf16).to(DType::f32))
                  .to(DType::bf16)
                  .to(DType::f32)
                  .to_vector<float>());
}

TEST_CASE("swiglu: gradients match finite differences", "[ops][swiglu][grad]") {
  const Tensor gate = normal({4, 6}, 3, 2.0), up = normal({4, 6}, 4);
  check_gradients([](auto& x) { return swiglu(x[0], x[1]); }, {gate, up});
  check_gradients([](auto& x) { return swiglu(x[0].t(), x[1]); }, {normal({6, 4}, 5), up});
  check_gradients([](auto& x) { return swiglu(x[0], x[1]); }, {gate, up}, {.check = {true, false}});
  check_gradients([](auto& x) { return swiglu(x[0], x[1]); }, {gate, up}, {.check = {false, true}});
  // The same tensor as gate and up: both gradients add.
  check_gradients([](auto& x) { return swiglu(x[0], x[0]); }, {gate});
  // As in an MLP: swiglu of two projections of one input.
  check_gradients([](auto& x) { return swiglu(matmul(x[0], x[1]), matmul(x[0], x[2])); },
                  {normal({3, 5}, 6), normal({5, 4}, 7), normal({5, 4}, 8)});
}

TEST_CASE("swiglu saves gate and up, and frees them after backward", "[ops][swiglu][memory]") {
  const std::int64_t live0 = saved_bytes_live();
  Tensor gate = normal({8, 32}, 9).set_requires_grad();
  Tensor up = normal({8, 32}, 10).set_requires_grad();
  {
    Tensor y = swiglu(gate, up);
    CHECK(saved_bytes_live() - live0 == std::int64_t(gate.nbytes() + up.nbytes()));
    CHECK(op_bytes(saved_bytes_report(), "swiglu") == std::int64_t(gate.nbytes() + up.nbytes()));
    backward({y}, {ones(y.sizes())});
  }
  CHECK(saved_bytes_live() == live0);
}

TEST_CASE("swiglu results do not depend on the thread count", "[ops][swiglu]") {
  const int threads = num_threads();
  const Tensor gate = normal({37, 1001}, 11, 3.0), up = normal({37, 1001}, 12);
  const Tensor r = normal({37, 1001}, 13);
  auto run = [&](int n) {
    set_num_threads(n);
    Tensor g = gate.detach().set_requires_grad(), u = up.detach().set_requires_grad();
    Tensor y = swiglu(g, u);
    backward({y}, {r});
    return std::vector<std::vector<float>>{y.to_vector<float>(), g.grad().to_vector<float>(),
                                           u.grad().to_vector<float>()};
  };
  const auto a = run(1), b = run(3), c = run(2);
  CHECK(a == b);
  CHECK(a == c);
  set_num_threads(threads);
}

TEST_CASE("swiglu rejects bad operands with clear messages", "[ops][swiglu]") {
  CHECK_THROWS_WITH(swiglu(zeros({2, 3}), zeros({2, 4})),
                    Catch::Contains("swiglu: gate [2, 3] f32 cpu and up [2, 4] f32 cpu must have the same shape"));
  CHECK_THROWS_WITH(swiglu(zeros({2, 3}), zeros({3})), Catch::Contains("must have the same shape"));
  CHECK_THROWS_WITH(swiglu(zeros({2}), zeros({2}, DType::bf16)),
                    Catch::Contains("swiglu: operands have different dtypes: [2] f32 cpu and [2] bf16 cpu"));
  CHECK_THROWS_WITH(swiglu(zeros({2}, DType::i32), zeros({2}, DType::i32)),
                    Catch::Contains("swiglu: gate must be floating"));
}

TEST_CASE("swiglu's backward writes dup into a gradient nothing else holds", "[ops][swiglu][memory]") {
  // The gradient reaching swiglu comes from the scale after it, and nothing
  // else holds it: dup goes into its buffer. A hook keeping that gradient
  // makes it the hook's too: dup gets a buffer of its own. Same bits either
  // way, and the kept gradient is untouched.
  const std::int64_t n = 256;
  const std::int64_t bytes = n * n * 4;
  const Tensor gate0 = normal({n, n}, 21, 2.0), up0 = normal({n, n}, 22);
  auto run = [&](bool keep, std::int64_t* peak) {
    Tensor g = gate0.detach().set_requires_grad(), u = up0.detach().set_requires_grad();
    Tensor y = swiglu(g, u);
    Tensor kept;
    if (keep)
      y.register_hook([&](const Tensor& d) {
        kept = d;
        return Tensor();
      });
    Tensor loss = sum(y * 1.5);
    y = Tensor();
    CachingAllocator& cpu = allocator_for(kCPU);
    const std::int64_t before = cpu.stats().allocated_bytes;
    cpu.reset_peak();
    loss.backward();
    *peak = cpu.stats().allocated_peak - before;
    if (keep) CHECK(kept.to_vector<float>() == std::vector<float>(std::size_t(n * n), 1.5f));
    return std::vector<std::vector<float>>{g.grad().to_vector<float>(), u.grad().to_vector<float>()};
  };
  std::int64_t alone = 0, held = 0;
  const auto a = run(false, &alone), b = run(true, &held);
  CHECK(a == b);
  INFO("peak during backward: " << alone << " bytes alone, " << held << " held; a gradient is " << bytes);
  CHECK(held - alone == bytes);
}
