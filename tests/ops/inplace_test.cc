#include <catch2/catch.hpp>

#include "ops/inplace.h"
#include "ops/ops.h"
#include "tests/ops/gradcheck.h"

using namespace remat;
using namespace remat::testing;

using F32 = std::vector<float>;

TEST_CASE("in-place ops: values and version counter", "[ops][inplace]") {
  Tensor x = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  const auto v0 = x.version();
  Tensor& r = add_(x, from_vector<float>({10, 20, 30}), 0.5);
  CHECK(&r == &x);
  CHECK(x.to_vector<float>() == F32{6, 12, 18, 9, 15, 21});
  CHECK(x.version() == v0 + 1);
  add_(x, full({}, 1.0));
  CHECK(x.to_vector<float>() == F32{7, 13, 19, 10, 16, 22});
  mul_(x, 2.0);
  CHECK(x.to_vector<float>() == F32{14, 26, 38, 20, 32, 44});
  CHECK(x.version() == v0 + 3);
  mul_(x, from_vector<float>({0.5, -1}, {2, 1}));
  CHECK(x.to_vector<float>() == F32{7, 13, 19, -20, -32, -44});
  copy_(x, from_vector<std::int64_t>({1, 2, 3}));  // broadcast and converted
  CHECK(x.to_vector<float>() == F32{1, 2, 3, 1, 2, 3});
  CHECK(x.version() == v0 + 5);
  zero_(x);
  CHECK(x.to_vector<float>() == F32(6, 0.0f));
  CHECK(x.version() == v0 + 6);
  // zero_ and copy_ work on any dtype.
  Tensor i = arange(4);
  zero_(i);
  CHECK(i.to_vector<std::int64_t>() == std::vector<std::int64_t>(4, 0));
  copy_(i, from_vector<float>({1.5f, 2.5f, -3.5f, 4}));
  CHECK(i.to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 2, -3, 4});
  // 16-bit destinations compute in f32 and round once.
  Tensor h = from_vector<float>({256, 1}).to(DType::bf16);
  add_(h, from_vector<float>({1, 1}).to(DType::bf16), 1.5);
  CHECK(h.to_vector<float>() == F32{258, 2.5f});
  Tensor g = from_vector<float>({1, 3}).to(DType::f16);
  mul_(g, 1.0 / 3.0);
  CHECK(g.to_vector<float>() == F32{float(f16(float(1.0 / 3.0))), 1.0f});
}

TEST_CASE("in-place ops write through non-contiguous views into the base", "[ops][inplace]") {
  Tensor base = arange(0.0, 12.0, 1.0).view({3, 4});
  const auto v0 = base.version();
  Tensor tv = base.t();  // [4, 3]
  add_(tv, from_vector<float>({100, 200, 300}));  // row i of base gets (i + 1) * 100
  CHECK(base.to_vector<float>() ==
        F32{100, 101, 102, 103, 204, 205, 206, 207, 308, 309, 310, 311});
  CHECK(base.version() == v0 + 1);
  CHECK(tv.version() == base.version());
  Tensor cols = base.slice(1, 0, 4, 2);  // columns 0 and 2
  mul_(cols, -1.0);
  CHECK(base.to_vector<float>() ==
        F32{-100, 101, -102, 103, -204, 205, -206, 207, -308, 309, -310, 311});
  Tensor row = base.select(0, 1);
  zero_(row);
  Tensor last_row = base.narrow(0, 2, 1), last_col = base.select(1, 3);
  copy_(last_row, from_vector<float>({1, 2, 3, 4}));
  mul_(last_col, from_vector<float>({2, 3, 4}));
  CHECK(base.to_vector<float>() == F32{-100, 101, -102, 206, 0, 0, 0, 0, 1, 2, 3, 16});
  CHECK(base.version() == v0 + 5);
  // An operand that overlaps the destination is read before anything is written.
  Tensor sq = from_vector<float>({1, 2, 3, 4}, {2, 2});
  add_(sq, sq.t());
  CHECK(sq.to_vector<float>() == F32{2, 5, 5, 8});
  mul_(sq, sq);
  CHECK(sq.to_vector<float>() == F32{4, 25, 25, 64});
  Tensor line = from_vector<float>({1, 2, 3, 4});
  Tensor tail = line.narrow(0, 1, 3);
  add_(tail, line.narrow(0, 0, 3));
  CHECK(line.to_vector<float>() == F32{1, 3, 5, 7});
}

TEST_CASE("in-place ops refuse writes autograd cannot track", "[ops][inplace]") {
  Tensor p = from_vector<float>({1, 2, 3}).set_requires_grad();
  Tensor y = from_vector<float>({1, 1, 1});
  CHECK_THROWS_WITH(add_(p, y), Catch::Contains("add_: in-place write to a tensor that requires grad "
                                                "([3] f32 cpu) while grad mode is on"));
  CHECK_THROWS_AS(mul_(p, 2.0), AutogradError);
  CHECK_THROWS_WITH(mul_(p, y), Catch::Contains("mul_: in-place write to a tensor that requires grad"));
  CHECK_THROWS_WITH(zero_(p), Catch::Contains("zero_: in-place write to a tensor that requires grad"));
  CHECK_THROWS_WITH(copy_(p, y), Catch::Contains("copy_: in-place write to a tensor that requires grad"));
  Tensor q = p * 2.0;  // an op output requires grad too
  CHECK_THROWS_AS(add_(q, y), AutogradError);
  CHECK(p.version() == 0);
  // A differentiable operand cannot flow into a plain tensor either.
  CHECK_THROWS_WITH(add_(y, p), Catch::Contains("add_: the operand [3] f32 cpu requires grad but add_ "
                                                "is not differentiable"));
  CHECK_THROWS_AS(copy_(y, p), AutogradError);
  // Under NoGradGuard (e.g. an optimizer step) the write is allowed.
  {
    NoGradGuard ng;
    add_(p, y, -0.5);
  }
  CHECK(p.to_vector<float>() == F32{0.5f, 1.5f, 2.5f});
  CHECK(p.version() == 1);
  CHECK(p.requires_grad());
  CHECK(p.is_leaf());
  // Shape and dtype errors.
  CHECK_THROWS_WITH(add_(y, zeros({2, 3})),
                    Catch::Contains("add_: operand [2, 3] f32 cpu cannot be broadcast to the "
                                    "destination's shape [3]"));
  CHECK_THROWS_WITH(add_(y, zeros({4})), Catch::Contains("add_: shapes [3] and [4] cannot be broadcast"));
  CHECK_THROWS_WITH(mul_(y, zeros({3}, DType::bf16)), Catch::Contains("mul_: operands have different dtypes"));
  Tensor iy = arange(3);
  CHECK_THROWS_WITH(mul_(iy, 2.0), Catch::Contains("mul_: destination must be floating"));
  CHECK_THROWS_WITH(copy_(y, zeros({2})), Catch::Contains("copy_: shapes [3] and [2] cannot be broadcast"));
  CHECK(y.version() == 0);
}

TEST_CASE("modifying a saved tensor in place makes backward fail clearly", "[ops][inplace][grad]") {
  SECTION("a tensor that needs no grad, written with grad mode on") {
    Tensor a = normal({2, 3}, 1).set_requires_grad();
    Tensor b = normal({2, 3}, 2);
    Tensor y = mul(a, b);  // saves b for a's gradient
    add_(b, ones({3}));
    CHECK(b.version() == 1);
    CHECK_THROWS_WITH(sum(y).backward(),
                      Catch::Contains("a tensor of shape [2, 3] saved by op 'mul' for backward was "
                                      "modified in place afterwards (saved at version 0, now version 1)"));
  }
  SECTION("a leaf that requires grad, written under NoGradGuard") {
    Tensor a = normal({4}, 3).set_requires_grad();
    Tensor b = normal({4}, 4).set_requires_grad();
    Tensor y = mul(a, b);  // saves a and b
    {
      NoGradGuard ng;
      mul_(b, 2.0);
      zero_(b);
    }
    try {
      sum(y).backward();
      FAIL("backward did not throw");
    } catch (const AutogradError& e) {
      const std::string msg = e.what();
      CHECK_THAT(msg, Catch::Contains("op 'mul'"));
      CHECK_THAT(msg, Catch::Contains("shape [4]"));
      CHECK_THAT(msg, Catch::Contains("saved at version 0, now version 2"));
    }
  }
  SECTION("a write through a view of the saved tensor") {
    Tensor a = normal({3, 2}, 5).set_requires_grad();
    Tensor b = normal({3, 2}, 6);
    Tensor y = mul(a, b);
    Tensor column = b.t().narrow(0, 1, 1);
    copy_(column, zeros({1, 3}));
    CHECK_THROWS_AS(sum(y).backward(), AutogradError);
  }
  SECTION("tensors nobody saved can be modified freely") {
    Tensor a = normal({3}, 7).set_requires_grad();
    Tensor b = normal({3}, 8);
    Tensor y = add(a, b);  // add saves nothing
    add_(b, ones({3}));
    sum(y).backward();
    CHECK(a.grad().to_vector<float>() == F32{1, 1, 1});
  }
}
