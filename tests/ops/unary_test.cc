#include <catch2/catch.hpp>

#include <cmath>

#include "ops/ops.h"
#include "tests/ops/gradcheck.h"

using namespace remat;
using namespace remat::testing;

TEST_CASE("unary ops forward values", "[ops][unary]") {
  Tensor x = from_vector<float>({-2.0f, -0.5f, 0.5f, 2.0f});
  auto v = [](const Tensor& t) { return t.to_vector<float>(); };
  CHECK(v(neg(x)) == std::vector<float>{2.0f, 0.5f, -0.5f, -2.0f});
  CHECK(v(relu(x)) == std::vector<float>{0.0f, 0.0f, 0.5f, 2.0f});
  CHECK(v(abs(x)) == std::vector<float>{2.0f, 0.5f, 0.5f, 2.0f});
  const auto e = v(exp(x));
  for (int i = 0; i < 4; ++i) CHECK(e[std::size_t(i)] == Approx(std::exp(x.at({i}))).epsilon(1e-6));
  const auto g = v(gelu(x));
  for (int i = 0; i < 4; ++i) {
    const double xi = x.at({i});
    const double ref = 0.5 * xi * (1 + std::tanh(std::sqrt(2 / M_PI) * (xi + 0.044715 * xi * xi * xi)));
    CHECK(g[std::size_t(i)] == Approx(ref).epsilon(1e-5));
  }
  const auto s = v(silu(x));
  for (int i = 0; i < 4; ++i) {
    const double xi = x.at({i});
    CHECK(s[std::size_t(i)] == Approx(xi / (1 + std::exp(-xi))).epsilon(1e-6));
  }
  Tensor p = from_vector<float>({1.0f, 4.0f, 9.0f});
  CHECK(v(sqrt(p)) == std::vector<float>{1, 2, 3});
  CHECK(v(rsqrt(p))[1] == Approx(0.5));
  CHECK(v(pow(p, 1.5))[1] == Approx(8.0));
  CHECK(v(log(p))[0] == 0.0f);
  CHECK_THROWS_AS(exp(zeros({2}, DType::i32)), DTypeError);
}

TEST_CASE("unary ops: gradients match finite differences", "[ops][unary][grad]") {
  const Tensor x = normal({3, 5}, 11);
  const Tensor pos = uniform({3, 5}, 0.5, 3.0, 12);
  // Away from 0 so |x| and relu are smooth within eps.
  const Tensor away = uniform({3, 5}, 0.2, 2.0, 13);
  check_gradients([](auto& t) { return neg(t[0]); }, {x});
  check_gradients([](auto& t) { return exp(t[0]); }, {x});
  check_gradients([](auto& t) { return log(t[0]); }, {pos});
  check_gradients([](auto& t) { return sqrt(t[0]); }, {pos});
  check_gradients([](auto& t) { return rsqrt(t[0]); }, {pos});
  check_gradients([](auto& t) { return pow(t[0], 2.5); }, {pos});
  check_gradients([](auto& t) { return abs(t[0]); }, {away});
  check_gradients([](auto& t) { return abs(neg(t[0])); }, {away});
  check_gradients([](auto& t) { return relu(t[0]); }, {away});
  check_gradients([](auto& t) { return relu(neg(t[0])); }, {away});
  check_gradients([](auto& t) { return gelu(t[0]); }, {x});
  check_gradients([](auto& t) { return silu(t[0]); }, {x});
  check_gradients([](auto& t) { return sigmoid(t[0]); }, {x});
  check_gradients([](auto& t) { return tanh(t[0]); }, {x});
  // Non-contiguous input.
  check_gradients([](auto& t) { return silu(t[0].t()); }, {x});
}
