#include <catch2/catch.hpp>

#include "ops/ops.h"
#include "tests/ops/gradcheck.h"

using namespace remat;
using namespace remat::testing;

TEST_CASE("sum, mean and max forward values", "[ops][reduce]") {
  Tensor x = arange(0.0, 24.0, 1.0).view({2, 3, 4});
  CHECK(sum(x).item() == 276.0);
  CHECK(mean(x).item() == 11.5);
  CHECK(sum(x, {1}).sizes() == Shape{2, 4});
  CHECK(sum(x, {1}).to_vector<float>() == std::vector<float>{12, 15, 18, 21, 48, 51, 54, 57});
  CHECK(sum(x, {0, 2}, true).sizes() == Shape{1, 3, 1});
  CHECK(sum(x, {0, 2}).to_vector<float>() == std::vector<float>{60, 92, 124});
  CHECK(mean(x, {-1}).to_vector<float>()[0] == 1.5f);
  auto [v, i] = max(from_vector<float>({1, 5, 5, 2, 9, 0}, {2, 3}), 1);
  CHECK(v.to_vector<float>() == std::vector<float>{5, 9});
  CHECK(i.to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 1});  // first occurrence
  CHECK(amax(x, 0, true).sizes() == Shape{1, 3, 4});
  CHECK_THROWS_WITH(sum(x, {1, 1}), Catch::Contains("sum: dim repeated"));
  CHECK_THROWS_WITH(sum(x, {3}), Catch::Contains("sum: dim 3 is out of range"));
  // A 0-dim tensor takes dim 0 (or -1) and has nothing to reduce.
  Tensor s0 = full({}, 3.0);
  CHECK(sum(s0, {0}).dim() == 0);
  CHECK(sum(s0, {0}).item() == 3.0);
  CHECK(mean(s0, {-1}, true).item() == 3.0);
  CHECK_THROWS_WITH(sum(s0, {1}), Catch::Contains("sum: dim 1 is out of range"));
}

TEST_CASE("long-row sums are deterministic and accurate", "[ops][reduce]") {
  Tensor big = ones({1, 100000});
  CHECK(sum(big).item() == 100000.0);
  const double s1 = sum(normal({3, 50001}, 7)).item();
  const double s2 = sum(normal({3, 50001}, 7)).item();
  CHECK(s1 == s2);
}

TEST_CASE("reductions: gradients match finite differences", "[ops][reduce][grad]") {
  const Tensor x = normal({3, 4, 5}, 21);
  check_gradients([](auto& t) { return sum(t[0]); }, {x});
  check_gradients([](auto& t) { return sum(t[0], {1}); }, {x});
  check_gradients([](auto& t) { return sum(t[0], {0, 2}, true); }, {x});
  check_gradients([](auto& t) { return mean(t[0], {-1}); }, {x});
  check_gradients([](auto& t) { return mean(t[0]); }, {x});
  // Distinct values 0.1 apart, so no two are within eps of a tie.
  std::vector<float> spaced(60);
  for (int k = 0; k < 60; ++k) spaced[std::size_t(k)] = float((k * 37) % 60) * 0.1f - 3.0f;
  const Tensor sx = from_vector<float>(spaced, {3, 4, 5});
  check_gradients([](auto& t) { return amax(t[0], 1); }, {sx});
  check_gradients([](auto& t) { return amax(t[0], 2, true); }, {sx});
  check_gradients([](auto& t) { return sum(t[0].transpose(0, 2), {1}); }, {x});
}
