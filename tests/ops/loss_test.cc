#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "engine/parallel_for.h"
#include "ops/loss.h"
#include "ops/ops.h"
#include "tests/ops/gradcheck.h"

using namespace remat;
using namespace remat::testing;

namespace {

// Mean cross-entropy in double over targets != ignore.
double ref_ce(const Tensor& logits, const std::vector<std::int64_t>& t, std::int64_t ignore = -100) {
  const auto v = logits.contiguous().to(DType::f32).to_vector<float>();
  const std::int64_t c = logits.size(-1), rows = logits.numel() / c;
  double total = 0;
  std::int64_t count = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    if (t[std::size_t(r)] == ignore) continue;
    const float* row = v.data() + r * c;
    double m = -INFINITY, s = 0;
    for (std::int64_t j = 0; j < c; ++j) m = std::max(m, double(row[j]));
    for (std::int64_t j = 0; j < c; ++j) s += std::exp(row[j] - m);
    total += m + std::log(s) - row[t[std::size_t(r)]];
    ++count;
  }
  return count ? total / double(count) : 0.0;
}


}  // namespace

TEST_CASE("cross_entropy matches a reference", "[ops][loss]") {
  const Tensor logits = normal({4, 5}, 1, 2.0);
  const std::vector<std::int64_t> t{0, 4, 2, 2};
  Tensor loss = cross_entropy(logits, from_vector<std::int64_t>(t));
  CHECK(loss.dim() == 0);
  CHECK(loss.dtype() == DType::f32);
  CHECK(loss.item() == Approx(ref_ce(logits, t)).epsilon(1e-6));
  // i32 targets.
  CHECK(cross_entropy(logits, from_vector<std::int32_t>({0, 4, 2, 2})).item() ==
        Approx(ref_ce(logits, t)).epsilon(1e-6));
  // Ignored rows are left out of the mean (default and custom ignore_index).
  const std::vector<std::int64_t> ti{0, -100, 2, -100};
  CHECK(cross_entropy(logits, from_vector<std::int64_t>(ti)).item() ==
        Approx(ref_ce(logits, ti)).epsilon(1e-6));
  const std::vector<std::int64_t> tj{3, 3, 1, 0};
  CHECK(cross_entropy(logits, from_vector<std::int64_t>(tj), 3).item() ==
        Approx(ref_ce(logits, tj, 3)).epsilon(1e-6));
  // [B, S, C] logits with [B, S] targets; non-contiguous logits.
  const Tensor l3 = normal({2, 3, 7}, 2, 3.0);
  const std::vector<std::int64_t> t3{6, 0, 1, 5, 3, 3};
  CHECK(cross_entropy(l3, from_vector<std::int64_t>(t3, {2, 3})).item() ==
        Approx(ref_ce(l3, t3)).epsilon(1e-6));
  const Tensor lt = normal({5, 4}, 3);
  CHECK(cross_entropy(lt.t(), from_vector<std::int64_t>(t)).item() ==
        Approx(ref_ce(lt.t(), t)).epsilon(1e-6));
  // 1-D logits with a 0-dim target; large logits stay finite.
  CHECK(cross_entropy(from_vector<float>({1000, 0, -1000}), full({}, 0.0, DType::i64)).item() ==
        Approx(0.0).margin(1e-6));
  CHECK(cross_entropy(from_vector<float>({1000, 0, -1000}), full({}, 1.0, DType::i64)).item() ==
        Approx(1000.0).epsilon(1e-6));
  // bf16 logits: computed in f32, the loss is f32.
  Tensor lb = logits.to(DType::bf16);
  Tensor loss_b = cross_entropy(lb, from_vector<std::int64_t>(t));
  CHECK(loss_b.dtype() == DType::f32);
  CHECK(loss_b.item() == Approx(ref_ce(lb, t)).epsilon(1e-5));
}

TEST_CASE("cross_entropy with every target ignored is 0 with zero gradients", "[ops][loss]") {
  Tensor logits = normal({3, 4}, 4).set_requires_grad();
  Tensor loss = cross_entropy(logits, full({3}, -100.0, DType::i64));
  CHECK(loss.item() == 0.0);
  loss.backward();
  CHECK(logits.grad().to_vector<float>() == std::vector<float>(12, 0.0f));
}

TEST_CASE("cross_entropy: gradients match finite differences", "[ops][loss][grad]") {
  const Tensor logits = normal({4, 5}, 5, 2.0);
  const Tensor t = from_vector<std::int64_t>({1, 0, 4, 4});
  check_gradients([](auto& x) { return cross_entropy(x[0], x[1]); }, {logits, t});
  // Ignored rows get exactly zero gradient.
  const Tensor ti = from_vector<std::int64_t>({1, -100, 4, -100});
  check_gradients([](auto& x) { return cross_entropy(x[0], x[1]); }, {logits, ti});
  check_gradients([](auto& x) { return cross_entropy(x[0], x[1], 4); }, {logits, t});
  // [B, S, C] logits, i32 targets, one position ignored.
  const Tensor l3 = normal({2, 3, 6}, 6, 2.0);
  const Tensor t3 = from_vector<std::int32_t>({5, 0, -100, 2, 3, 3}, {2, 3});
  check_gradients([](auto& x) { return cross_entropy(x[0], x[1]); }, {l3, t3});
  // Non-contiguous logits, and a loss scaled after the op.
  check_gradients([](auto& x) { return cross_entropy(x[0].t(), x[1]) * 3.0; },
                  {normal({5, 4}, 7), t});
  check_gradients([](auto& x) { return cross_entropy(x[0].transpose(0, 1), x[1]); },
                  {normal({3, 2, 6}, 8), t3});

  Tensor lg = logits.detach().set_requires_grad();
  cross_entropy(lg, ti).backward();
  const auto g = lg.grad().to_vector<float>();
  for (int j = 0; j < 5; ++j) {
    CHECK(g[std::size_t(5 + j)] == 0.0f);
    CHECK(g[std::size_t(15 + j)] == 0.0f);
  }
}

TEST_CASE("cross_entropy saves logits, targets and one f32 per row", "[ops][loss][memory]") {
  const std::int64_t live0 = saved_bytes_live();
  Tensor logits = normal({2, 8, 50}, 9).set_requires_grad();
  Tensor t = zeros({2, 8}, DType::i64);
  {
    Tensor loss = cross_entropy(logits, t);
    const std::int64_t expect = std::int64_t(logits.nbytes() + t.nbytes()) + 4 * 16;
    CHECK(saved_bytes_live() - live0 == expect);
    CHECK(op_bytes(saved_bytes_report(), "cross_entropy") == expect);
    loss.backward();
  }
  CHECK(saved_bytes_live() == live0);
}

TEST_CASE("cross_entropy results do not depend on the thread count", "[ops][loss]") {
  const int threads = num_threads();
  const Tensor logits = normal({300, 1000}, 10);
  std::vector<std::int64_t> tv(300);
  for (std::size_t i = 0; i < tv.size(); ++i) tv[i] = std::int64_t((i * 7919) % 1000);
  tv[17] = -100;
  const Tensor t = from_vector<std::int64_t>(tv);
  auto run = [&](int n) {
    set_num_threads(n);
    Tensor l = logits.detach().set_requires_grad();
    Tensor loss = cross_entropy(l, t);
    loss.backward();
    return std::make_pair(loss.item(), l.grad().to_vector<float>());
  };
  const auto a = run(1), b = run(3);
  CHECK(a.first == b.first);
  CHECK(a.second == b.second);
  set_num_threads(threads);
  CHECK(a.first == Approx(ref_ce(logits, tv)).epsilon(1e-6));
}

TEST_CASE("cross_entropy rejects bad operands with clear messages", "[ops][loss]") {
  const Tensor logits = zeros({2, 5});
  CHECK_THROWS_WITH(cross_entropy(logits, from_vector<std::int64_t>({1, 7})),
                    Catch::Contains("cross_entropy: target 7 at position 1 is out of range for 5 classes"));
  CHECK_THROWS_WITH(cross_entropy(logits, from_vector<std::int32_t>({-1, 0})),
                    Catch::Contains("target -1 at position 0 is out of range for 5 classes"));
  CHECK_THROWS_WITH(cross_entropy(logits, zeros({3}, DType::i64)),
                    Catch::Contains("cross_entropy: targets [3] i64 cpu do not match logits [2, 5] "
                                    "f32 cpu (expected targets of shape [2])"));
  CHECK_THROWS_WITH(cross_entropy(logits, zeros({2})),
                    Catch::Contains("cross_entropy: targets must be an index tensor (i32 or i64), got [2] f32"));
  CHECK_THROWS_WITH(cross_entropy(zeros({2, 5}, DType::i64), zeros({2}, DType::i64)),
                    Catch::Contains("cross_entropy: logits must be floating"));
  CHECK_THROWS_AS(cross_entropy(zeros({}), zeros({}, DType::i64)), ShapeError);
}
