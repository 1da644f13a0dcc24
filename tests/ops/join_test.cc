#include <catch2/catch.hpp>

#include "ops/join.h"
#include "ops/ops.h"
#include "tests/ops/gradcheck.h"

using namespace remat;
using namespace remat::testing;

TEST_CASE("cat forward values along any dim, any dtype, strided inputs", "[ops][join]") {
  Tensor a = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from_vector<float>({7, 8}, {2, 1});
  Tensor c = from_vector<float>({9, 10, 11, 12}, {2, 2});
  Tensor r = cat({a, b, c}, 1);
  CHECK(r.sizes() == Shape{2, 6});
  CHECK(r.to_vector<float>() == std::vector<float>{1, 2, 3, 7, 9, 10, 4, 5, 6, 8, 11, 12});
  CHECK(r.is_contiguous());
  CHECK(cat({a, a}, 0).to_vector<float>() ==
        std::vector<float>{1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6});
  CHECK(cat({a, a}, -2).sizes() == Shape{4, 3});
  // Non-contiguous inputs (a transpose, a strided slice) mixed with contiguous ones.
  Tensor at = a.t();  // [3, 2]: 1 4 / 2 5 / 3 6
  CHECK(cat({at, c.t()}, 0).to_vector<float>() ==
        std::vector<float>{1, 4, 2, 5, 3, 6, 9, 11, 10, 12});
  Tensor every_other = arange(0.0, 12.0, 1.0).view({3, 4}).slice(1, 0, 4, 2);  // [3, 2]
  CHECK(cat({at, every_other}, 1).to_vector<float>() ==
        std::vector<float>{1, 4, 0, 2, 2, 5, 4, 6, 3, 6, 8, 10});
  // Empty pieces are allowed.
  CHECK(cat({a, zeros({2, 0}), b}, 1).to_vector<float>() ==
        std::vector<float>{1, 2, 3, 7, 4, 5, 6, 8});
  // Integer and 16-bit dtypes are copied exactly.
  Tensor i = from_vector<std::int64_t>({1, 2, 3});
  CHECK(cat({i, i.slice(0, 0, 3, 2)}, 0).to_vector<std::int64_t>() ==
        std::vector<std::int64_t>{1, 2, 3, 1, 3});
  Tensor h = cat({a.to(DType::bf16), c.to(DType::bf16)}, 1);
  CHECK(h.dtype() == DType::bf16);
  CHECK(h.to_vector<float>() == std::vector<float>{1, 2, 3, 9, 10, 4, 5, 6, 11, 12});
  // A single input is copied, not aliased.
  Tensor one = cat({a}, 0);
  CHECK(!one.shares_storage_with(a));
  CHECK(one.to_vector<float>() == a.to_vector<float>());
}

TEST_CASE("cat, split and stack reject bad operands with clear messages", "[ops][join]") {
  Tensor a = zeros({2, 3});
  CHECK_THROWS_WITH(cat({}, 0), Catch::Contains("cat: expected at least one tensor"));
  CHECK_THROWS_WITH(cat({a, zeros({3, 3})}, 1),
                    Catch::Contains("cat: tensor 1 has shape [3, 3] but tensor 0 has shape [2, 3]; "
                                    "sizes must match except in dim 1"));
  CHECK_THROWS_WITH(cat({a, zeros({2})}, 0), Catch::Contains("cat: tensor 1 has shape [2]"));
  CHECK_THROWS_WITH(cat({a, zeros({2, 3}, DType::bf16)}, 0),
                    Catch::Contains("cat: tensor 1 is [2, 3] bf16 cpu but tensor 0 is [2, 3] f32 cpu"));
  CHECK_THROWS_AS(cat({a, zeros({2, 3}, DType::bf16)}, 0), DTypeError);
  CHECK_THROWS_WITH(cat({a, a}, 2), Catch::Contains("cat: dim 2 is out of range"));
  CHECK_THROWS_WITH(cat({zeros({}), zeros({})}, 0), Catch::Contains("cat: tensors must have at least one dim"));
  CHECK_THROWS_WITH(split(a, 0, 1), Catch::Contains("split: split_size must be positive, got 0"));
  CHECK_THROWS_WITH(split(a, std::vector<std::int64_t>{1, 1}, 1),
                    Catch::Contains("split: sizes [1, 1] must be >= 0 and sum to 3"));
  CHECK_THROWS_WITH(split(a, std::vector<std::int64_t>{4, -1}, 1), Catch::Contains("split: sizes [4, -1]"));
  CHECK_THROWS_WITH(stack({a, zeros({3, 2})}, 0),
                    Catch::Contains("stack: tensor 1 has shape [3, 2] but tensor 0 has shape [2, 3]"));
  CHECK_THROWS_WITH(stack({a, a}, 3), Catch::Contains("stack: dim 3 is out of range"));
  CHECK_THROWS_WITH(stack({}, 0), Catch::Contains("stack: expected at least one tensor"));
}

TEST_CASE("split returns views; stack adds a dim", "[ops][join]") {
  Tensor x = arange(0.0, 10.0, 1.0).view({2, 5});
  auto parts = split(x, 2, 1);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0].sizes() == Shape{2, 2});
  CHECK(parts[2].sizes() == Shape{2, 1});
  CHECK(parts[1].to_vector<float>() == std::vector<float>{2, 3, 7, 8});
  CHECK(parts[2].to_vector<float>() == std::vector<float>{4, 9});
  CHECK(parts[1].shares_storage_with(x));
  CHECK(split(x, 5, 1).size() == 1);
  CHECK(split(x, 7, 1).size() == 1);
  auto rows = split(x, 1, 0);
  REQUIRE(rows.size() == 2);
  CHECK(rows[1].to_vector<float>() == std::vector<float>{5, 6, 7, 8, 9});
  auto sized = split(x, std::vector<std::int64_t>{1, 0, 4}, -1);
  REQUIRE(sized.size() == 3);
  CHECK(sized[1].numel() == 0);
  CHECK(sized[2].to_vector<float>() == std::vector<float>{1, 2, 3, 4, 6, 7, 8, 9});
  // Splitting and concatenating again gives the input back.
  CHECK(cat(split(x, 2, 1), 1).to_vector<float>() == x.to_vector<float>());
  CHECK(split(zeros({0, 3}), 2, 0).size() == 1);

  Tensor a = from_vector<float>({1, 2, 3});
  Tensor b = from_vector<float>({4, 5, 6});
  Tensor s0 = stack({a, b}, 0);
  CHECK(s0.sizes() == Shape{2, 3});
  CHECK(s0.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
  Tensor s1 = stack({a, b}, -1);
  CHECK(s1.sizes() == Shape{3, 2});
  CHECK(s1.to_vector<float>() == std::vector<float>{1, 4, 2, 5, 3, 6});
  Tensor sc = stack({full({}, 1.0), full({}, 2.0)}, 0);
  CHECK(sc.sizes() == Shape{2});
  CHECK(stack({a.view({3, 1}), b.view({3, 1})}, 1).sizes() == Shape{3, 2, 1});
}

TEST_CASE("cat, split, stack: gradients match finite differences", "[ops][join][grad]") {
  const Tensor a = normal({3, 4}, 1), b = normal({3, 2}, 2), c = normal({4, 3}, 3);
  check_gradients([](auto& t) { return cat({t[0], t[1]}, 1); }, {a, b});
  // Non-contiguous input, and the same input twice.
  check_gradients([](auto& t) { return cat({t[0], t[2].t(), t[1], t[0]}, 1) * 2.0; }, {a, b, c});
  check_gradients([](auto& t) { return cat({t[0].t(), t[1]}, 0); }, {a, c});
  check_gradients([](auto& t) {
    auto p = split(t[0], 3, 1);
    return cat({p[1], p[0] * p[0]}, 1);
  }, {normal({2, 7}, 4)});
  check_gradients([](auto& t) {
    auto p = split(t[0].t(), std::vector<std::int64_t>{1, 2}, 0);
    return p[1] * 3.0 - p[0];
  }, {a.narrow(1, 0, 3)});
  check_gradients([](auto& t) { return stack({t[0], t[1].t(), t[0]}, 1); }, {a, normal({4, 3}, 5)});
}

TEST_CASE("cat gives no gradient to inputs that need none", "[ops][join][grad]") {
  Tensor a = normal({2, 3}, 6).set_requires_grad();
  Tensor b = normal({2, 2}, 7);
  Tensor y = cat({b, a}, 1);
  REQUIRE(y.requires_grad());
  sum(y * from_vector<float>({1, 2, 3, 4, 5}, {1, 5})).backward();
  CHECK(a.grad().to_vector<float>() == std::vector<float>{3, 4, 5, 3, 4, 5});
  CHECK(!b.grad().defined());
  // Integer cats record nothing.
  CHECK(!cat({arange(3), arange(2)}, 0).requires_grad());
  // The cat node saves no tensors, only sizes.
  Tensor z = cat({a, b}, 1);
  REQUIRE(z.grad_fn() != nullptr);
  CHECK(std::string(z.grad_fn()->name()) == "cat");
  CHECK(z.grad_fn()->saved_tensors().empty());
}
