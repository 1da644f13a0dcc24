#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "ops/cast.h"
#include "ops/ops.h"
#include "tests/ops/gradcheck.h"

using namespace remat;
using namespace remat::testing;

using F32 = std::vector<float>;

TEST_CASE("cast rounds to bf16 and f16 to nearest even", "[ops][cast]") {
  const float inf = std::numeric_limits<float>::infinity();
  // bf16 keeps 8 significant bits: ties at 1 + 2^-8 go to the even neighbour.
  Tensor x = from_vector<float>({1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, -3.0f,
                                 0.1f});
  Tensor b = cast(x, DType::bf16);
  CHECK(b.dtype() == DType::bf16);
  CHECK(b.sizes() == x.sizes());
  CHECK(cast(b, DType::f32).to_vector<float>() == F32{1.0f, 1.015625f, 1.0078125f, -3.0f, 0.10009765625f});
  // f16: 11 significant bits, overflow to infinity, subnormals down to 2^-24.
  Tensor y = from_vector<float>({1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65504.0f, 65520.0f, 0x1p-24f,
                                 0x1p-25f, 3 * 0x1p-26f, -0.0f});
  Tensor h = cast(y, DType::f16);
  CHECK(h.dtype() == DType::f16);
  const F32 hv = cast(h, DType::f32).to_vector<float>();
  CHECK(hv == F32{1.0f, 1.0f + 0x1p-9f, 65504.0f, inf, 0x1p-24f, 0.0f, 0x1p-24f, 0.0f});
  CHECK(std::signbit(hv[7]));
  // NaN stays NaN; bf16 <-> f16 goes through the exact f32 value.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(cast(cast(from_vector<float>({nan}), DType::bf16), DType::f32).item()));
  CHECK(cast(cast(x, DType::bf16), DType::f16).to_vector<float>()[1] == 1.015625f);
  // Non-contiguous input; integer <-> floating conversions.
  Tensor m = from_vector<float>({1.5f, 2.25f, -3.75f, 4.0f}, {2, 2});
  CHECK(cast(m.t(), DType::bf16).to_vector<float>() == F32{1.5f, -3.75f, 2.25f, 4.0f});
  CHECK(cast(m, DType::i64).to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 2, -3, 4});
  CHECK(cast(arange(3), DType::f16).to_vector<float>() == F32{0, 1, 2});
  // Same dtype: the tensor itself.
  CHECK(cast(m, DType::f32).is_same(m));
}

TEST_CASE("cast: gradients flow back in the input's dtype", "[ops][cast][grad]") {
  Tensor x = from_vector<float>({0.5f, -1.25f, 2.0f, 3.0f}, {2, 2}).set_requires_grad();
  Tensor w = from_vector<float>({1, 2, 3, 4}, {2, 2}).to(DType::bf16);
  Tensor y = cast(x, DType::bf16);
  REQUIRE(y.grad_fn() != nullptr);
  CHECK(std::string(y.grad_fn()->name()) == "cast");
  sum(y * w).backward();
  REQUIRE(x.grad().defined());
  CHECK(x.grad().dtype() == DType::f32);
  CHECK(x.grad().to_vector<float>() == F32{1, 2, 3, 4});

  Tensor hb = from_vector<float>({0.5f, 1.5f}).to(DType::f16).set_requires_grad();
  sum(cast(hb, DType::f32) * from_vector<float>({3, -2})).backward();
  CHECK(hb.grad().dtype() == DType::f16);
  CHECK(hb.grad().to_vector<float>() == F32{3, -2});

  // Finite differences: values and element steps are multiples of 1/16, exact
  // in bf16 and f16; the cast is linear, so a large step keeps the rounding of
  // the random directional step small relative to it.
  GradcheckOptions opt;
  opt.eps = 0.5;
  const Tensor q = from_vector<float>({0.5f, -1.25f, 0.0625f, 1.75f, -0.375f, 1.0f}, {2, 3});
  check_gradients([](auto& t) { return cast(t[0], DType::bf16); }, {q}, opt);
  check_gradients([](auto& t) { return cast(t[0].t(), DType::f16) * 2.0; }, {q}, opt);
  check_gradients([](auto& t) { return cast(cast(t[0], DType::f16), DType::f32); }, {q}, opt);
}

TEST_CASE("cast refuses to drop gradients into integer dtypes", "[ops][cast]") {
  Tensor x = from_vector<float>({1.5f, 2.5f}).set_requires_grad();
  CHECK_THROWS_WITH(cast(x, DType::i64),
                    Catch::Contains("cast: cannot cast [2] f32 cpu to i64 while it requires grad"));
  CHECK_THROWS_AS(cast(x, DType::boolean), DTypeError);
  CHECK_THROWS_AS(cast(x * 2.0, DType::i32), DTypeError);
  // Without grad mode, or detached, the copy is fine (and carries no history).
  {
    NoGradGuard ng;
    CHECK(cast(x, DType::i64).to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 2});
  }
  Tensor d = cast(x.detach(), DType::i32);
  CHECK(!d.requires_grad());
  CHECK(d.to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 2});
}
