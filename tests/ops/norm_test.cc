#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "engine/parallel_for.h"
#include "ops/norm.h"
#include "ops/ops.h"
#include "tests/ops/gradcheck.h"

using namespace remat;
using namespace remat::testing;

namespace {

// RMSNorm / LayerNorm over the last dim in double (w, b may be undefined).
std::vector<double> ref_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, bool rms) {
  const auto v = x.contiguous().to_vector<float>();
  const std::int64_t d = x.size(-1), rows = x.numel() / d;
  std::vector<float> wv = w.defined() ? w.to_vector<float>() : std::vector<float>();
  std::vector<float> bv = b.defined() ? b.to_vector<float>() : std::vector<float>();
  std::vector<double> out(v.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = v.data() + r * d;
    double mean = 0, sq = 0;
    if (!rms) {
      for (std::int64_t j = 0; j < d; ++j) mean += row[j];
      mean /= double(d);
    }
    for (std::int64_t j = 0; j < d; ++j) sq += (row[j] - mean) * (row[j] - mean);
    const double rstd = 1.0 / std::sqrt(sq / double(d) + eps);
    for (std::int64_t j = 0; j < d; ++j) {
      double y = (row[j] - mean) * rstd;
      if (w.defined()) y *= wv[std::size_t(j)];
      if (b.defined()) y += bv[std::size_t(j)];
      out[std::size_t(r * d + j)] = y;
    }
  }
  return out;
}

void check_close(const Tensor& got, const std::vector<double>& want, double tol = 1e-5) {
  const auto g = got.to(DType::f32).contiguous().to_vector<float>();
  REQUIRE(g.size() == want.size());
  for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == Approx(want[i]).margin(tol).epsilon(1e-5));
}


}  // namespace

TEST_CASE("rms_norm matches a reference", "[ops][norm]") {
  const Tensor x = normal({2, 3, 8}, 1, 3.0);
  const Tensor w = normal({8}, 2);
  check_close(rms_norm(x, w), ref_norm(x, w, Tensor(), 1e-5, true));
  check_close(rms_norm(x, w, 0.5), ref_norm(x, w, Tensor(), 0.5, true));
  // Non-contiguous input; 1-D input.
  const Tensor xt = normal({8, 5}, 3);
  check_close(rms_norm(xt.t(), w), ref_norm(xt.t().contiguous(), w, Tensor(), 1e-5, true));
  check_close(rms_norm(x.select(0, 0).select(0, 1), w),
              ref_norm(x.select(0, 0).select(0, 1), w, Tensor(), 1e-5, true));
  // Zero rows stay zero (eps keeps rstd finite).
  CHECK(rms_norm(zeros({2, 8}), w).to_vector<float>() == std::vector<float>(16, 0.0f));
  // bf16 computes in f32 and keeps the dtype.
  Tensor h = rms_norm(x.to(DType::bf16), w.to(DType::bf16));
  CHECK(h.dtype() == DType::bf16);
  const auto want = ref_norm(x.to(DType::bf16).to(DType::f32), w.to(DType::bf16).to(DType::f32),
                             Tensor(), 1e-5, true);
  const auto got = h.to(DType::f32).to_vector<float>();
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).margin(2e-2).epsilon(1e-2));
}

TEST_CASE("layer_norm matches a reference, with and without affine", "[ops][norm]") {
  const Tensor x = uniform({4, 6}, -2.0, 5.0, 4);
  const Tensor w = normal({6}, 5), b = normal({6}, 6);
  check_close(layer_norm(x, w, b), ref_norm(x, w, b, 1e-5, false));
  check_close(layer_norm(x, Tensor(), Tensor()), ref_norm(x, Tensor(), Tensor(), 1e-5, false));
  check_close(layer_norm(x, w, Tensor()), ref_norm(x, w, Tensor(), 1e-5, false));
  check_close(layer_norm(x, Tensor(), b, 0.1), ref_norm(x, Tensor(), b, 0.1, false));
  check_close(layer_norm(x.t().contiguous().t(), w, b), ref_norm(x, w, b, 1e-5, false));
  // Without affine every row has mean 0 and (biased) variance 1 / (1 + eps / var).
  const auto y = layer_norm(x, Tensor(), Tensor()).to_vector<float>();
  for (int r = 0; r < 4; ++r) {
    double m = 0;
    for (int j = 0; j < 6; ++j) m += y[std::size_t(r * 6 + j)];
    CHECK(m == Approx(0.0).margin(1e-5));
  }
}

TEST_CASE("rms_norm and layer_norm: gradients match finite differences", "[ops][norm][grad]") {
  const Tensor x = normal({3, 5}, 11);
  const Tensor x3 = normal({2, 3, 6}, 12);
  const Tensor w5 = normal({5}, 13), b5 = normal({5}, 14);
  const Tensor w6 = normal({6}, 15), b6 = normal({6}, 16);
  check_gradients([](auto& t) { return rms_norm(t[0], t[1]); }, {x, w5});
  check_gradients([](auto& t) { return rms_norm(t[0], t[1], 0.3); }, {x3, w6});
  // Non-contiguous input: [6, 3] transposed to [3, 6].
  check_gradients([](auto& t) { return rms_norm(t[0].t(), t[1]); }, {normal({6, 3}, 17), w6});
  // Only one of the inputs needs a gradient.
  check_gradients([](auto& t) { return rms_norm(t[0], t[1]); }, {x, w5}, {.check = {true, false}});
  check_gradients([](auto& t) { return rms_norm(t[0], t[1]); }, {x, w5}, {.check = {false, true}});

  check_gradients([](auto& t) { return layer_norm(t[0], t[1], t[2]); }, {x, w5, b5});
  check_gradients([](auto& t) { return layer_norm(t[0], t[1], t[2]); }, {x3, w6, b6});
  check_gradients([](auto& t) { return layer_norm(t[0], Tensor(), Tensor()); }, {x});
  check_gradients([](auto& t) { return layer_norm(t[0], t[1], Tensor()); }, {x3, w6});
  check_gradients([](auto& t) { return layer_norm(t[0], Tensor(), t[1], 0.2); }, {x, b5});
  check_gradients([](auto& t) { return layer_norm(t[0].transpose(0, 2), t[1], t[2]); },
                  {normal({6, 3, 2}, 18), normal({6}, 19), normal({6}, 20)});
  check_gradients([](auto& t) { return layer_norm(t[0], t[1], t[2]); }, {x, w5, b5},
                  {.check = {false, true, true}});
  check_gradients([](auto& t) { return layer_norm(t[0], t[1], t[2]); }, {x, w5, b5},
                  {.check = {true, false, false}});
  check_gradients([](auto& t) { return layer_norm(t[0], t[1], t[2]); }, {x, w5, b5},
                  {.check = {false, false, true}});
  check_gradients([](auto& t) { return layer_norm(t[0], t[1], t[2]); }, {x, w5, b5},
                  {.check = {false, true, false}});
}

TEST_CASE("rms_norm saves x, weight and one f32 per row, and frees them after backward",
          "[ops][norm][memory]") {
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO("dtype " << dt);
    const std::int64_t live0 = saved_bytes_live();
    const std::int64_t op0 = op_bytes(saved_bytes_report(), "rms_norm");
    Tensor x = normal({4, 6, 32}, 21).to(dt).set_requires_grad();
    Tensor w = normal({32}, 22).to(dt).set_requires_grad();
    {
      Tensor y = rms_norm(x, w);
      const std::int64_t rows = 24;
      const std::int64_t expect = std::int64_t(x.nbytes() + w.nbytes()) + 4 * rows;
      const auto rep = saved_bytes_report();
      CHECK(rep.live_bytes - live0 == expect);
      CHECK(op_bytes(rep, "rms_norm") - op0 == expect);
      CHECK(expect < std::int64_t(2 * x.nbytes()));  // no full-size intermediate
      backward({y}, {ones(y.sizes(), dt)});
    }
    CHECK(saved_bytes_live() == live0);
    CHECK(op_bytes(saved_bytes_report(), "rms_norm") == op0);
    CHECK(x.grad().defined());
    CHECK(w.grad().defined());
  }
}

TEST_CASE("layer_norm saves x, weight and per-row statistics only", "[ops][norm][memory]") {
  const std::int64_t live0 = saved_bytes_live();
  Tensor x = normal({10, 16}, 23).set_requires_grad();
  Tensor w = normal({16}, 24).set_requires_grad();
  Tensor b = normal({16}, 25).set_requires_grad();
  {
    Tensor y = layer_norm(x, w, b);
    CHECK(saved_bytes_live() - live0 == std::int64_t(x.nbytes() + w.nbytes()) + 2 * 4 * 10);
    backward({y}, {ones(y.sizes())});
  }
  CHECK(saved_bytes_live() == live0);
  // d/db sum(y) is the number of rows.
  CHECK(b.grad().to_vector<float>() == std::vector<float>(16, 10.0f));
  // Only the bias needs a gradient: nothing is saved.
  Tensor b2 = normal({16}, 26).set_requires_grad();
  {
    Tensor y = layer_norm(x.detach(), w.detach(), b2);
    CHECK(saved_bytes_live() == live0);
    backward({y}, {ones(y.sizes())});
  }
  CHECK(b2.grad().to_vector<float>() == std::vector<float>(16, 10.0f));
}

TEST_CASE("norm gradients do not depend on the thread count", "[ops][norm]") {
  const int threads = num_threads();
  const Tensor x = normal({1000, 512}, 31);
  const Tensor w = normal({512}, 32), b = normal({512}, 33);
  const Tensor r = normal({1000, 512}, 34);
  auto run = [&](int n, bool rms) {
    set_num_threads(n);
    Tensor xx = x.detach().set_requires_grad();
    Tensor ww = w.detach().set_requires_grad();
    Tensor bb = b.detach().set_requires_grad();
    Tensor y = rms ? rms_norm(xx, ww) : layer_norm(xx, ww, bb);
    backward({y}, {r});
    std::vector<std::vector<float>> out{y.to_vector<float>(), xx.grad().to_vector<float>(),
                                        ww.grad().to_vector<float>()};
    if (!rms) out.push_back(bb.grad().to_vector<float>());
    return out;
  };
  for (bool rms : {true, false}) {
    INFO((rms ? "rms_norm" : "layer_norm"));
    const auto a = run(1, rms);
    const auto c = run(3, rms);
    const auto d = run(2, rms);
    for (std::size_t i = 0; i < a.size(); ++i) {
      CHECK(a[i] == c[i]);
      CHECK(a[i] == d[i]);
    }
  }
  set_num_threads(threads);
  // The weight gradient over many rows is accurate, too.
  Tensor xx = x.detach();
  Tensor ww = ones({512}).set_requires_grad();
  backward({rms_norm(xx, ww)}, {ones({1000, 512})});
  const auto gw = ww.grad().to_vector<float>();
  const auto xn = rms_norm(xx, ones({512})).to_vector<float>();
  for (std::int64_t j = 0; j < 512; j += 37) {
    double s = 0;
    for (std::int64_t i = 0; i < 1000; ++i) s += xn[std::size_t(i * 512 + j)];
    CHECK(gw[std::size_t(j)] == Approx(s).margin(1e-3).epsilon(1e-4));
  }
}

TEST_CASE("norms reject bad operands with clear messages", "[ops][norm]") {
  const Tensor x = zeros({2, 4});
  CHECK_THROWS_WITH(rms_norm(x, zeros({3})),
                    Catch::Contains("rms_norm: weight must be [4] (the input's last dim), got [3] f32 cpu"));
  CHECK_THROWS_WITH(rms_norm(x, zeros({4}, DType::bf16)),
                    Catch::Contains("rms_norm: weight [4] bf16 cpu must have the input's dtype"));
  CHECK_THROWS_WITH(rms_norm(zeros({2, 4}, DType::i32), zeros({4})),
                    Catch::Contains("rms_norm: input must be floating"));
  CHECK_THROWS_WITH(rms_norm(zeros({}), zeros({1})), Catch::Contains("rms_norm: input must have at least 1 dim"));
  CHECK_THROWS_WITH(rms_norm(x, Tensor()), Catch::Contains("rms_norm: weight is an undefined tensor"));
  CHECK_THROWS_WITH(layer_norm(x, zeros({4}), zeros({2, 4})),
                    Catch::Contains("layer_norm: bias must be [4] (the input's last dim), got [2, 4]"));
  CHECK_THROWS_AS(layer_norm(x, zeros({5}), Tensor()), ShapeError);
}
