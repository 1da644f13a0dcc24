#include <catch2/catch.hpp>

#include "engine/parallel_for.h"
#include "ops/dropout.h"
#include "ops/ops.h"
#include "tests/ops/gradcheck.h"

using namespace remat;
using namespace remat::testing;

namespace {
// The keep mask of a draw of n elements from `state`, straight from the stream.
std::vector<bool> reference_mask(std::int64_t n, RngState state, double p) {
  std::vector<float> u(static_cast<std::size_t>(n));
  philox_fill_uniform(u.data(), n, state);
  std::vector<bool> keep(u.size());
  for (std::size_t i = 0; i < u.size(); ++i) keep[i] = double(u[i]) >= p;
  return keep;
}
}  // namespace

TEST_CASE("dropout keeps u >= p from the Philox stream and scales by 1/(1-p)", "[ops][dropout]") {
  const double p = 0.3;
  const Tensor x = uniform({37, 53}, 0.5, 2.0, 1);  // no zeros, so out == 0 means dropped
  Generator gen(42);
  gen.set_state({42, 7});
  const RngState s0 = gen.state();
  Tensor y = dropout(x, p, true, &gen);
  // The draw reserved exactly numel elements' worth of blocks.
  CHECK(gen.state() == RngState{42, 7 + philox_blocks(37 * 53)});
  CHECK(y.sizes() == x.sizes());
  const auto keep = reference_mask(x.numel(), s0, p);
  const auto xv = x.to_vector<float>(), yv = y.to_vector<float>();
  const float scale = float(1.0 / (1.0 - p));
  std::int64_t kept = 0;
  for (std::size_t i = 0; i < xv.size(); ++i) {
    CHECK(yv[i] == (keep[i] ? xv[i] * scale : 0.0f));
    kept += keep[i];
  }
  // Kept fraction ~ 1 - p (1961 draws: sd ~ 0.01).
  CHECK(double(kept) / double(x.numel()) == Approx(1.0 - p).margin(0.04));

  // A larger draw: the fraction converges.
  Tensor big = dropout(ones({200000}), 0.25, true, &gen);
  const auto bv = big.to_vector<float>();
  std::int64_t nz = 0;
  for (float b : bv) nz += b != 0.0f;
  CHECK(double(nz) / double(bv.size()) == Approx(0.75).margin(0.005));
}

TEST_CASE("dropout replays bit-identically from the same (seed, offset)", "[ops][dropout]") {
  const Tensor x = normal({4, 5, 6}, 2);
  Generator gen(7);
  const RngState s0 = gen.state();
  Tensor a = dropout(x, 0.5, true, &gen);
  Tensor b = dropout(x, 0.5, true, &gen);  // the offset moved on: another mask
  CHECK(a.to_vector<float>() != b.to_vector<float>());
  gen.set_state(s0);
  Tensor a2 = dropout(x, 0.5, true, &gen);
  CHECK(a2.to_vector<float>() == a.to_vector<float>());
  // Another generator at the same state, and another thread count, agree too.
  Generator other(0);
  other.set_state(s0);
  const int threads = num_threads();
  set_num_threads(1);
  Tensor a3 = dropout(x, 0.5, true, &other);
  set_num_threads(threads);
  CHECK(a3.to_vector<float>() == a.to_vector<float>());
  // Non-contiguous input: element i is the i-th element in row-major order.
  gen.set_state(s0);
  Tensor xt = x.transpose(0, 2);
  Tensor at = dropout(xt, 0.5, true, &gen);
  gen.set_state(s0);
  CHECK(at.to_vector<float>() == dropout(xt.contiguous(), 0.5, true, &gen).to_vector<float>());
  // The default generator: manual_seed makes it reproducible.
  manual_seed(123);
  Tensor d1 = dropout(x, 0.5);
  manual_seed(123);
  CHECK(dropout(x, 0.5).to_vector<float>() == d1.to_vector<float>());
  // bf16 computes in f32 and rounds once.
  gen.set_state(s0);
  Tensor h = dropout(x.to(DType::bf16), 0.5, true, &gen);
  CHECK(h.dtype() == DType::bf16);
  CHECK(h.to_vector<float>() == a.to(DType::bf16).to_vector<float>());
}

TEST_CASE("dropout is the identity for p == 0 or eval, and rejects bad p", "[ops][dropout]") {
  Tensor x = normal({3, 4}, 3);
  Generator gen(1);
  CHECK(dropout(x, 0.0, true, &gen).is_same(x));
  CHECK(dropout(x, 0.7, false, &gen).is_same(x));
  CHECK(gen.state() == RngState{1, 0});  // nothing drawn
  CHECK_THROWS_WITH(dropout(x, 1.0), Catch::Contains("dropout: probability p must be in [0, 1), got 1"));
  CHECK_THROWS_WITH(dropout(x, -0.1), Catch::Contains("dropout: probability p must be in [0, 1), got -0.1"));
  CHECK_THROWS_AS(dropout(x, std::nan("")), Error);
  CHECK_THROWS_WITH(dropout(zeros({3}, DType::i64), 0.5),
                    Catch::Contains("dropout: input must be floating"));
}

TEST_CASE("dropout backward regenerates the mask: grad = mask / (1 - p) * g", "[ops][dropout][grad]") {
  const double p = 0.4;
  Tensor x = normal({6, 7}, 4).set_requires_grad(true);
  Generator gen(99);
  const RngState s0 = gen.state();
  Tensor y = dropout(x, p, true, &gen);
  // The node holds no saved tensors (no mask).
  REQUIRE(y.grad_fn());
  CHECK(y.grad_fn()->saved_tensors().empty());
  CHECK(saved_bytes_report().bytes_by_op.count("dropout") == 0);
  // The generator may move on before backward: the node kept its own state.
  dropout(x, p, true, &gen);
  const Tensor g = normal({6, 7}, 5);
  y.backward(g);
  const auto keep = reference_mask(x.numel(), s0, p);
  const auto gv = g.to_vector<float>(), dx = x.grad().to_vector<float>();
  const float scale = float(1.0 / (1.0 - p));
  for (std::size_t i = 0; i < gv.size(); ++i) CHECK(dx[i] == (keep[i] ? gv[i] * scale : 0.0f));

  // Finite differences, replaying the same mask on every evaluation.
  Generator fixed(5);
  const RngState fs = fixed.state();
  auto f = [&](const std::vector<Tensor>& t) {
    fixed.set_state(fs);
    return dropout(t[0], 0.3, true, &fixed);
  };
  check_gradients(f, {normal({5, 6}, 6)});
  auto ft = [&](const std::vector<Tensor>& t) {
    fixed.set_state(fs);
    return dropout(t[0].t(), 0.3, true, &fixed) * 2.0;
  };
  check_gradients(ft, {normal({6, 5}, 7)});
}
