#include <catch2/catch.hpp>

#include <cmath>

#include "ops/ops.h"
#include "ops/rotary.h"
#include "tests/ops/gradcheck.h"

using namespace remat;
using namespace remat::testing;

namespace {
// Direct reference in double: x [..., S, D] (contiguous, row-major values).
std::vector<double> reference(const Tensor& x, double theta, std::int64_t offset) {
  const auto v = x.to(DType::f32).contiguous().to_vector<float>();
  const std::int64_t S = x.size(-2), D = x.size(-1), h = D / 2;
  std::vector<double> out(v.size());
  for (std::size_t r = 0; r < v.size() / std::size_t(D); ++r) {
    const double pos = double(offset + std::int64_t(r) % S);
    for (std::int64_t i = 0; i < h; ++i) {
      const double a = pos * std::pow(theta, -2.0 * double(i) / double(D));
      const double x1 = v[r * D + i], x2 = v[r * D + h + i];
      out[r * D + i] = x1 * std::cos(a) - x2 * std::sin(a);
      out[r * D + h + i] = x2 * std::cos(a) + x1 * std::sin(a);
    }
  }
  return out;
}

void check_close(const Tensor& got, const std::vector<double>& want, double tol = 1e-5) {
  const auto g = got.to(DType::f32).contiguous().to_vector<float>();
  REQUIRE(g.size() == want.size());
  for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == Approx(want[i]).margin(tol).epsilon(tol));
}
}  // namespace

TEST_CASE("rotary_embedding matches a direct reference", "[ops][rotary]") {
  const Tensor x = normal({2, 3, 9, 8}, 1);
  check_close(rotary_embedding(x), reference(x, 10000.0, 0));
  check_close(rotary_embedding(x, 500.0, 17), reference(x, 500.0, 17));
  // Large positions stay accurate (angles are computed in double).
  check_close(rotary_embedding(x, 10000.0, 100000), reference(x, 10000.0, 100000));
  // Non-contiguous input: a [B, S, H, D] tensor viewed as [B, H, S, D].
  const Tensor bshd = normal({2, 9, 3, 8}, 2);
  const Tensor xv = bshd.transpose(1, 2);
  check_close(rotary_embedding(xv, 10000.0, 3), reference(xv.contiguous(), 10000.0, 3));
  // 2-D input [S, D]; position 0 is the identity.
  const Tensor x2 = normal({5, 4}, 3);
  Tensor y2 = rotary_embedding(x2);
  CHECK(y2.select(0, 0).to_vector<float>() == x2.select(0, 0).to_vector<float>());
  check_close(y2, reference(x2, 10000.0, 0));
  // position_offset shifts positions.
  Tensor shifted = rotary_embedding(x.narrow(2, 4, 5), 10000.0, 4);
  CHECK(shifted.to_vector<float>() == rotary_embedding(x).narrow(2, 4, 5).to_vector<float>());
  // bf16 in, bf16 out.
  Tensor h = rotary_embedding(x.to(DType::bf16));
  CHECK(h.dtype() == DType::bf16);
  check_close(h, reference(x.to(DType::bf16), 10000.0, 0), 1e-2);
  // Rounded once: the bits of the f32 op on the same values, rounded to bf16.
  CHECK(h.to(DType::f32).to_vector<float>() ==
        rotary_embedding(x.to(DType::bf16).to(DType::f32)).to(DType::bf16).to(DType::f32).to_vector<float>());
}

TEST_CASE("rotary_embedding rejects bad input", "[ops][rotary]") {
  CHECK_THROWS_WITH(rotary_embedding(zeros({2, 3, 5})),
                    Catch::Contains("rotary_embedding: the last dim (head dim D) must be even, got [2, 3, 5] f32 cpu"));
  CHECK_THROWS_WITH(rotary_embedding(zeros({4})),
                    Catch::Contains("rotary_embedding: input must be [..., S, D], got [4] f32 cpu"));
  CHECK_THROWS_WITH(rotary_embedding(zeros({2, 4}), 0.0), Catch::Contains("theta must be positive"));
  CHECK_THROWS_AS(rotary_embedding(zeros({2, 4}, DType::i64)), DTypeError);
}

TEST_CASE("rotary_embedding: backward is the inverse rotation, saves nothing", "[ops][rotary][grad]") {
  Tensor x = normal({2, 2, 6, 8}, 4).set_requires_grad(true);
  Tensor y = rotary_embedding(x, 10000.0, 5);
  REQUIRE(y.grad_fn());
  CHECK(y.grad_fn()->saved_tensors().empty());
  // Rotating the gradient back: grad of sum(y * g) is R^T g; R^T R = I, so
  // with g = y the gradient is x.
  y.backward(y.detach());
  const auto xv = x.detach().to_vector<float>();
  check_close(x.grad(), std::vector<double>(xv.begin(), xv.end()), 1e-5);

  check_gradients([](auto& t) { return rotary_embedding(t[0]); }, {normal({1, 2, 5, 6}, 5)});
  check_gradients([](auto& t) { return rotary_embedding(t[0], 100.0, 7); }, {normal({3, 4}, 6)});
  // Non-contiguous input.
  check_gradients([](auto& t) { return rotary_embedding(t[0].transpose(1, 2), 10000.0, 2); },
                  {normal({2, 5, 3, 4}, 7)});
}
