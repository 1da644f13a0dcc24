#include <catch2/catch.hpp>

#include "ops/ops.h"
#include "tests/ops/gradcheck.h"

using namespace remat;
using namespace remat::testing;

TEST_CASE("add/sub/mul/div forward values with broadcasting", "[ops][binary]") {
  Tensor a = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from_vector<float>({10, 20, 30});
  CHECK((a + b).to_vector<float>() == std::vector<float>{11, 22, 33, 14, 25, 36});
  CHECK((a - b).to_vector<float>() == std::vector<float>{-9, -18, -27, -6, -15, -24});
  CHECK((a * b).to_vector<float>() == std::vector<float>{10, 40, 90, 40, 100, 180});
  Tensor col = from_vector<float>({2, 4}, {2, 1});
  CHECK((a / col).to_vector<float>() == std::vector<float>{0.5f, 1, 1.5f, 1, 1.25f, 1.5f});
  CHECK((a * 2.0).to_vector<float>() == std::vector<float>{2, 4, 6, 8, 10, 12});
  CHECK((1.0 - a).to_vector<float>() == std::vector<float>{0, -1, -2, -3, -4, -5});
  // Non-contiguous operands.
  CHECK((a.t() + a.t()).to_vector<float>() == std::vector<float>{2, 8, 4, 10, 6, 12});
  // bf16 computes in f32 and rounds once.
  Tensor h = a.to(DType::bf16) + b.to(DType::bf16);
  CHECK(h.dtype() == DType::bf16);
  CHECK(h.to_vector<float>() == std::vector<float>{11, 22, 33, 14, 25, 36});
}

TEST_CASE("binary ops reject bad operands with clear messages", "[ops][binary]") {
  Tensor a = zeros({2, 3});
  CHECK_THROWS_WITH(a + zeros({4}), Catch::Contains("add: shapes [2, 3] and [4] cannot be broadcast"));
  CHECK_THROWS_WITH(a * zeros({3}, DType::bf16),
                    Catch::Contains("mul: operands have different dtypes: [2, 3] f32 cpu and [3] bf16 cpu"));
  CHECK_THROWS_AS(zeros({3}, DType::i64) + zeros({3}, DType::i64), DTypeError);
}

TEST_CASE("binary ops: gradients match finite differences", "[ops][binary][grad]") {
  const Tensor a = normal({3, 4}, 1);
  const Tensor b = normal({3, 4}, 2);
  const Tensor row = normal({4}, 3);
  const Tensor col = uniform({3, 1}, 0.5, 2.0, 4);
  check_gradients([](auto& x) { return x[0] + x[1]; }, {a, b});
  check_gradients([](auto& x) { return x[0] - x[1]; }, {a, row});
  check_gradients([](auto& x) { return x[0] * x[1]; }, {a, row});
  check_gradients([](auto& x) { return x[0] * x[1]; }, {col, a});
  check_gradients([](auto& x) { return x[0] / x[1]; }, {a, col});
  check_gradients([](auto& x) { return x[0] / x[1]; }, {row, col});
  // Non-contiguous inputs.
  check_gradients([](auto& x) { return x[0].t() * x[1]; }, {normal({4, 3}, 5), a});
  check_gradients([](auto& x) { return (x[0] * 3.0 + 1.0) / 2.0 - x[0]; }, {a});
  check_gradients([](auto& x) { return 2.0 - x[0]; }, {a});
  // The same tensor on both sides: gradients from both uses add up.
  check_gradients([](auto& x) { return x[0] * x[0]; }, {a});
}
