#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "engine/parallel_for.h"
#include "ops/ops.h"
#include "ops/topk.h"
#include "tests/ops/gradcheck.h"

using namespace remat;
using namespace remat::testing;

using I64 = std::vector<std::int64_t>;
using F32 = std::vector<float>;

TEST_CASE("topk forward values, sorted best first", "[ops][topk]") {
  Tensor x = from_vector<float>({3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8}, {2, 6});
  auto [v, i] = topk(x, 3);
  CHECK(v.sizes() == Shape{2, 3});
  CHECK(v.to_vector<float>() == F32{9, 5, 4, 8, 6, 5});
  CHECK(i.dtype() == DType::i64);
  CHECK(i.to_vector<std::int64_t>() == I64{5, 4, 2, 5, 1, 2});
  auto [sv, si] = topk(x, 2, 1, /*largest=*/false);
  CHECK(sv.to_vector<float>() == F32{1, 1, 2, 3});
  CHECK(si.to_vector<std::int64_t>() == I64{1, 3, 0, 3});
  // Along dim 0, and on a non-contiguous input.
  auto [v0, i0] = topk(x, 1, 0);
  CHECK(v0.sizes() == Shape{1, 6});
  CHECK(v0.to_vector<float>() == F32{3, 6, 5, 3, 5, 9});
  CHECK(i0.to_vector<std::int64_t>() == I64{0, 1, 1, 1, 0, 0});  // column 4 ties: row 0
  auto [vt, it] = topk(x.t(), 2, 0);  // [2, 2]: column c is the top 2 of row c of x
  CHECK(vt.to_vector<float>() == F32{9, 8, 5, 6});
  CHECK(it.to_vector<std::int64_t>() == I64{5, 5, 4, 1});
  // 3-D, middle dim.
  Tensor x3 = from_vector<float>({1, 6, 3, 2, 5, 4, 0, 7}, {2, 2, 2});
  auto [v3, i3] = topk(x3, 1, 1);
  CHECK(v3.sizes() == Shape{2, 1, 2});
  CHECK(v3.to_vector<float>() == F32{3, 6, 5, 7});
  CHECK(i3.to_vector<std::int64_t>() == I64{1, 0, 0, 1});
  // k = 0 and k = n; 16-bit values are returned exactly.
  CHECK(topk(x, 0).first.sizes() == Shape{2, 0});
  CHECK(topk(x, 6).first.to_vector<float>() == F32{9, 5, 4, 3, 1, 1, 8, 6, 5, 5, 3, 2});
  auto [hv, hi] = topk(x.to(DType::bf16) * 1.01, 2);
  CHECK(hv.dtype() == DType::bf16);
  CHECK(hi.to_vector<std::int64_t>() == I64{5, 4, 5, 1});
  CHECK(hv.to_vector<float>()[0] == float(bf16(9.0f * float(bf16(1.01f)))));
}

TEST_CASE("topk ties go to the lower index; NaN ranks above every number", "[ops][topk]") {
  Tensor t = from_vector<float>({1, 3, 3, 2, 3});
  CHECK(topk(t, 2).second.to_vector<std::int64_t>() == I64{1, 2});
  CHECK(topk(t, 4).second.to_vector<std::int64_t>() == I64{1, 2, 4, 3});
  CHECK(topk(t, 2, 0, false).second.to_vector<std::int64_t>() == I64{0, 3});
  Tensor eq = from_vector<float>({2, 1, 1, 1, 2});
  CHECK(topk(eq, 3, 0, false).second.to_vector<std::int64_t>() == I64{1, 2, 3});
  CHECK(topk(eq, 3).second.to_vector<std::int64_t>() == I64{0, 4, 1});
  // -0.0 and 0.0 are equal: index order decides.
  Tensor z = from_vector<float>({-1, 0.0f, -0.0f, -1});
  CHECK(topk(z, 2).second.to_vector<std::int64_t>() == I64{1, 2});
  Tensor z2 = from_vector<float>({-0.0f, 0.0f});
  CHECK(topk(z2, 1).second.to_vector<std::int64_t>() == I64{0});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor n = from_vector<float>({1, nan, 5, nan, -2});
  CHECK(topk(n, 3).second.to_vector<std::int64_t>() == I64{1, 3, 2});
  CHECK(topk(n, 3, 0, false).second.to_vector<std::int64_t>() == I64{4, 0, 2});
  CHECK(topk(n, 5, 0, false).second.to_vector<std::int64_t>() == I64{4, 0, 2, 1, 3});
  const float inf = std::numeric_limits<float>::infinity();
  Tensor in = from_vector<float>({inf, nan, -inf});
  CHECK(topk(in, 3).second.to_vector<std::int64_t>() == I64{1, 0, 2});
}

TEST_CASE("topk routing is identical for any thread count", "[ops][topk]") {
  // Router-like logits drawn from a few values, so most rows have many ties.
  const std::int64_t tokens = 3000, experts = 16;
  std::vector<float> logits(std::size_t(tokens * experts));
  for (std::size_t k = 0; k < logits.size(); ++k) logits[k] = float((k * 2654435761u) % 5) * 0.25f;
  Tensor x = from_vector<float>(logits, {tokens, experts});
  auto route = [&](int threads) {
    const int before = num_threads();
    set_num_threads(threads);
    auto r = topk(x, 4).second.to_vector<std::int64_t>();
    set_num_threads(before);
    return r;
  };
  const auto r1 = route(1);
  CHECK(route(2) == r1);
  CHECK(route(5) == r1);
  // Against a reference: stable ordering by value, lower index first.
  bool ok = true;
  for (std::int64_t t = 0; t < tokens && ok; ++t) {
    std::vector<std::int64_t> order(static_cast<std::size_t>(experts));
    for (std::int64_t e = 0; e < experts; ++e) order[std::size_t(e)] = e;
    const float* row = logits.data() + t * experts;
    std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return row[a] > row[b]; });
    for (std::int64_t j = 0; j < 4; ++j)
      ok = ok && r1[std::size_t(t * 4 + j)] == order[std::size_t(j)];
  }
  CHECK(ok);
}

TEST_CASE("topk rejects bad operands with clear messages", "[ops][topk]") {
  Tensor x = zeros({3, 4});
  CHECK_THROWS_WITH(topk(x, 5), Catch::Contains("topk: k = 5 is out of range for dim 1 of size 4 "
                                                 "(input [3, 4] f32 cpu; expected 0 <= k <= 4)"));
  CHECK_THROWS_WITH(topk(x, -1, 0), Catch::Contains("topk: k = -1 is out of range for dim 0 of size 3"));
  CHECK_THROWS_WITH(topk(x, 1, 2), Catch::Contains("topk: dim 2 is out of range"));
  CHECK_THROWS_WITH(topk(zeros({4}, DType::i64), 1), Catch::Contains("topk: input must be floating"));
  CHECK_THROWS_WITH(topk(zeros({}), 1), Catch::Contains("topk: input must have at least one dim"));
}

TEST_CASE("topk: gradients flow to the picked entries", "[ops][topk][grad]") {
  // Distinct values 0.1 apart, so no two are within eps of a tie.
  std::vector<float> spaced(60);
  for (int k = 0; k < 60; ++k) spaced[std::size_t(k)] = float((k * 37) % 60) * 0.1f - 3.0f;
  const Tensor x = from_vector<float>(spaced, {3, 4, 5});
  check_gradients([](auto& t) { return topk(t[0], 2).first; }, {x});
  check_gradients([](auto& t) { return topk(t[0], 3, 1, false).first; }, {x});
  check_gradients([](auto& t) { return topk(t[0], 1, 0).first; }, {x});
  check_gradients([](auto& t) { return topk(t[0].transpose(0, 2), 4, 1).first; }, {x});
  check_gradients([](auto& t) { return topk(t[0], 5).first * 2.0; }, {x});

  Tensor leaf = from_vector<float>({1, 3, 3, 2}).set_requires_grad();
  auto [v, i] = topk(leaf, 2);
  CHECK(v.requires_grad());
  CHECK(!i.requires_grad());
  sum(v * from_vector<float>({10, 20})).backward();
  CHECK(leaf.grad().to_vector<float>() == F32{0, 10, 20, 0});  // the tie's lower index got rank 0
  // Only the indices are saved.
  auto [v2, i2] = topk(leaf * 1.0, 1);
  REQUIRE(v2.grad_fn() != nullptr);
  CHECK(v2.grad_fn()->saved_tensors().size() == 1);
  CHECK(v2.grad_fn()->saved_tensors()[0]->info().is_output);
  CHECK(v2.grad_fn()->saved_tensors()[0]->info().meta.dtype == DType::i64);
}

TEST_CASE("topk: a bf16 input's gradient is bf16, the upstream values at the picked entries", "[ops][topk][grad]") {
  Tensor leaf = from_vector<float>({1, 3, 3, 2}).to(DType::bf16).set_requires_grad();
  auto [v, i] = topk(leaf, 2);
  sum(v.to(DType::f32) * from_vector<float>({10, 20})).backward();
  REQUIRE(leaf.grad().dtype() == DType::bf16);
  CHECK(leaf.grad().to(DType::f32).to_vector<float>() == F32{0, 10, 20, 0});
}
