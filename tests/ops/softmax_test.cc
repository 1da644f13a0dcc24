#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "engine/parallel_for.h"
#include "ops/ops.h"
#include "ops/softmax.h"
#include "tests/ops/gradcheck.h"

using namespace remat;
using namespace remat::testing;

namespace {

// Softmax (or log-softmax) of x over `dim`, in double, in x's row-major order.
std::vector<double> ref_softmax(const Tensor& x, std::int64_t dim, bool log) {
  const auto v = x.contiguous().to_vector<float>();
  const Shape& s = x.sizes();
  std::int64_t inner = 1;
  for (std::size_t d = std::size_t(dim) + 1; d < s.size(); ++d) inner *= s[d];
  const std::int64_t n = s[std::size_t(dim)];
  const std::int64_t outer = x.numel() / (n * inner);
  std::vector<double> out(v.size());
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = 0; i < inner; ++i) {
      auto at = [&](std::int64_t k) { return std::size_t((o * n + k) * inner + i); };
      double m = -INFINITY;
      for (std::int64_t k = 0; k < n; ++k) m = std::max(m, double(v[at(k)]));
      double sum = 0;
      for (std::int64_t k = 0; k < n; ++k) sum += std::exp(double(v[at(k)]) - m);
      for (std::int64_t k = 0; k < n; ++k)
        out[at(k)] = log ? double(v[at(k)]) - m - std::log(sum) : std::exp(double(v[at(k)]) - m) / sum;
    }
  return out;
}

void check_close(const Tensor& got, const std::vector<double>& want, double tol = 1e-6) {
  const auto g = got.to(DType::f32).contiguous().to_vector<float>();
  REQUIRE(g.size() == want.size());
  for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == Approx(want[i]).margin(tol).epsilon(1e-5));
}


}  // namespace

TEST_CASE("softmax and log_softmax match a reference over every dim", "[ops][softmax]") {
  const Tensor x = normal({3, 4, 5}, 1, 2.0);
  for (std::int64_t dim = 0; dim < 3; ++dim) {
    INFO("dim " << dim);
    Tensor y = softmax(x, dim);
    CHECK(y.sizes() == x.sizes());
    CHECK(y.is_contiguous());
    check_close(y, ref_softmax(x, dim, false));
    check_close(log_softmax(x, dim), ref_softmax(x, dim, true), 1e-5);
    check_close(softmax(x, dim - 3), ref_softmax(x, dim, false));  // negative dims
  }
  // Default dim is the last; non-contiguous input.
  check_close(softmax(x.transpose(0, 2)), ref_softmax(x.transpose(0, 2).contiguous(), 2, false));
  // Rows sum to one; a single-element row gives 1 (log 0).
  const auto s = sum(softmax(x), {-1}).to_vector<float>();
  for (float v : s) CHECK(v == Approx(1.0).epsilon(1e-6));
  CHECK(softmax(ones({2, 1})).to_vector<float>() == std::vector<float>{1, 1});
  CHECK(log_softmax(ones({2, 1})).to_vector<float>() == std::vector<float>{0, 0});
  // A 0-dim input is a one-element row.
  CHECK(softmax(full({}, 3.0)).item() == 1.0);
}

TEST_CASE("softmax is numerically stable for large logits", "[ops][softmax]") {
  Tensor x = from_vector<float>({1000, 1001, 1002, -1000, -1001, -1002}, {2, 3});
  Tensor y = softmax(x);
  const auto v = y.to_vector<float>();
  for (float f : v) CHECK(std::isfinite(f));
  check_close(y, ref_softmax(x, 1, false));
  Tensor l = log_softmax(x);
  for (float f : l.to_vector<float>()) CHECK(std::isfinite(f));
  check_close(l, ref_softmax(x, 1, true), 1e-5);
  CHECK(l.at({0, 2}) == Approx(-std::log(1 + std::exp(-1.0) + std::exp(-2.0))).epsilon(1e-6));
}

TEST_CASE("softmax of 16-bit inputs computes in f32 and keeps the dtype", "[ops][softmax]") {
  const Tensor x = normal({4, 7}, 2);
  for (DType dt : {DType::bf16, DType::f16}) {
    Tensor xh = x.to(dt);
    Tensor y = softmax(xh, 0);
    CHECK(y.dtype() == dt);
    const auto want = ref_softmax(xh.to(DType::f32), 0, false);
    const auto got = y.to(DType::f32).to_vector<float>();
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).margin(1e-2));
    // Rounded once: the bits of the f32 op on the same values, rounded.
    CHECK(got == softmax(xh.to(DType::f32), 0).to(dt).to(DType::f32).to_vector<float>());
  }
}

TEST_CASE("softmax and log_softmax: gradients match finite differences", "[ops][softmax][grad]") {
  const Tensor x = normal({3, 4, 5}, 3);
  check_gradients([](auto& t) { return softmax(t[0]); }, {x});
  check_gradients([](auto& t) { return log_softmax(t[0]); }, {x});
  // Over non-last dims (permuted to last and back).
  check_gradients([](auto& t) { return softmax(t[0], 1); }, {x});
  check_gradients([](auto& t) { return softmax(t[0], 0); }, {x});
  check_gradients([](auto& t) { return log_softmax(t[0], 1); }, {x});
  check_gradients([](auto& t) { return log_softmax(t[0], -3); }, {x});
  // Non-contiguous inputs.
  check_gradients([](auto& t) { return softmax(t[0].t()); }, {normal({6, 4}, 4)});
  check_gradients([](auto& t) { return log_softmax(t[0].transpose(0, 2), 1); }, {x});
  // Composed with another op, so the incoming gradient is not the seed.
  check_gradients([](auto& t) { return softmax(t[0] * t[1]) * t[1]; }, {normal({3, 5}, 5), normal({3, 5}, 6)});
}

TEST_CASE("softmax saves only its output, and frees it after backward", "[ops][softmax][memory]") {
  const std::int64_t live0 = saved_bytes_live();
  Tensor x = normal({8, 16}, 7).set_requires_grad();
  {
    Tensor y = softmax(x, 0);
    const auto rep = saved_bytes_report();
    CHECK(op_bytes(rep, "softmax") == std::int64_t(y.nbytes()));
    CHECK(rep.live_bytes - live0 == std::int64_t(y.nbytes()));
    Tensor l = log_softmax(x);
    CHECK(op_bytes(saved_bytes_report(), "log_softmax") == std::int64_t(l.nbytes()));
    backward({y, l}, {ones(y.sizes()), ones(l.sizes())});
  }
  CHECK(saved_bytes_live() == live0);
  // d/dx sum(softmax) = 0; d/dx sum(log_softmax) = 1 - n * softmax.
  Tensor g = x.grad();
  const auto sm = softmax(x.detach()).to_vector<float>();
  const auto gv = g.to_vector<float>();
  for (std::size_t i = 0; i < gv.size(); ++i) CHECK(gv[i] == Approx(1.0 - 16.0 * sm[i]).margin(1e-5));
}

TEST_CASE("softmax results do not depend on the thread count", "[ops][softmax]") {
  const int threads = num_threads();
  const Tensor x = normal({257, 300}, 8);
  const Tensor r = normal({257, 300}, 9);
  auto run = [&](int n, std::int64_t dim, bool log) {
    set_num_threads(n);
    Tensor xx = x.detach().set_requires_grad();
    Tensor y = log ? log_softmax(xx, dim) : softmax(xx, dim);
    backward({y}, {r});
    return std::make_pair(y.to_vector<float>(), xx.grad().to_vector<float>());
  };
  for (std::int64_t dim : {0, 1})
    for (bool log : {false, true}) {
      const auto a = run(1, dim, log);
      const auto b = run(3, dim, log);
      CHECK(a.first == b.first);
      CHECK(a.second == b.second);
    }
  set_num_threads(threads);
}

TEST_CASE("softmax rejects bad inputs with clear messages", "[ops][softmax]") {
  CHECK_THROWS_WITH(softmax(zeros({2, 3}, DType::i64)),
                    Catch::Contains("softmax: input must be floating") &&
                        Catch::Contains("[2, 3] i64 cpu"));
  CHECK_THROWS_AS(log_softmax(zeros({2}, DType::i32)), DTypeError);
  CHECK_THROWS_WITH(softmax(zeros({2, 3}), 2), Catch::Contains("softmax: dim 2 is out of range"));
  CHECK_THROWS_WITH(log_softmax(zeros({2, 3}), -3),
                    Catch::Contains("log_softmax: dim -3 is out of range"));
  CHECK_THROWS_AS(softmax(Tensor()), Error);
}
