#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
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

// The bits of t's values as f32 (exact for bf16 and f16): equal vectors mean
// equal bits, the signs of zeros included.
std::vector<std::uint32_t> bits(const Tensor& t) {
  const auto v = t.detach().to(DType::f32).contiguous().to_vector<float>();
  std::vector<std::uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// A fresh leaf that requires grad, with t's values.
Tensor leaf(const Tensor& t) { return t.detach().clone().set_requires_grad(); }


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
  // Rounded once: the bits of the f32 op on the same values, rounded to bf16.
  const Tensor once = rms_norm(x.to(DType::bf16).to(DType::f32), w.to(DType::bf16).to(DType::f32)).to(DType::bf16);
  CHECK(got == once.to(DType::f32).to_vector<float>());
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

// ---------------------------------------------------------------------------
// add_rms_norm: the residual add and the RMSNorm after it, fused.

TEST_CASE("add_rms_norm: h and y have the bits of add and rms_norm", "[ops][norm][add_rms_norm]") {
  // Row lengths that are and are not multiples of 8 and 16.
  const std::vector<Shape> shapes{{3, 16}, {2, 5, 37}, {4, 512}, {7}, {6, 3, 13}};
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (const Shape& shape : shapes) {
      INFO("dtype " << dt << ", shape " << shape_str(shape));
      const std::int64_t d = shape.back();
      const Tensor x = normal(shape, 51, 2.0).to(dt), r = normal(shape, 52).to(dt);
      const Tensor w = normal({d}, 53).to(dt);
      for (double eps : {1e-5, 0.25}) {
        const AddRmsNorm o = add_rms_norm(x, r, w, eps);
        const Tensor h = add(x, r);
        CHECK(o.h.dtype() == dt);
        CHECK(o.y.dtype() == dt);
        CHECK(o.h.sizes() == shape);
        CHECK(o.y.sizes() == shape);
        CHECK(bits(o.h) == bits(h));
        CHECK(bits(o.y) == bits(rms_norm(h, w, eps)));
      }
    }
  }
  // Non-contiguous operands; the values against a double reference.
  const Tensor xt = normal({24, 5}, 54), rt = normal({24, 5}, 55), w = normal({24}, 56);
  const AddRmsNorm o = add_rms_norm(xt.t(), rt.t(), w);
  CHECK(bits(o.h) == bits(add(xt.t(), rt.t())));
  CHECK(bits(o.y) == bits(rms_norm(add(xt.t(), rt.t()), w)));
  check_close(o.y, ref_norm(add(xt.t(), rt.t()).contiguous(), w, Tensor(), 1e-5, true));
  // Non-finite values and rounding ties keep the unfused bits (the vector
  // rounding to bf16 included): inf - inf is NaN, which fills its row of y.
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    INFO("dtype " << dt);
    const float inf = std::numeric_limits<float>::infinity();
    std::vector<float> xv(2 * 19), rv(2 * 19);
    for (std::size_t i = 0; i < xv.size(); ++i) {
      xv[i] = 1.0f + float(i % 16) * 0x1p-7f;  // bf16 values whose sums fall on
      rv[i] = float(i % 3) * 0x1p-8f;           // bf16 ties (both ways)
    }
    xv[3] = inf;
    rv[3] = -inf;  // row 0: NaN
    xv[25] = inf;  // row 1: inf
    const Tensor x = from_vector<float>(xv, {2, 19}).to(dt), r = from_vector<float>(rv, {2, 19}).to(dt);
    const Tensor w = normal({19}, 58).to(dt);
    const AddRmsNorm o = add_rms_norm(x, r, w);
    CHECK(bits(o.h) == bits(add(x, r)));
    CHECK(bits(o.y) == bits(rms_norm(add(x, r), w)));
    CHECK(std::isnan(o.y.to(DType::f32).to_vector<float>()[0]));
  }
  // A zero sum stays zero.
  const Tensor z = normal({2, 8}, 57);
  CHECK(add_rms_norm(z, mul(z, -1.0), ones({8})).y.to_vector<float>() == std::vector<float>(16, 0.0f));
}

TEST_CASE("add_rms_norm: gradients match finite differences", "[ops][norm][add_rms_norm][grad]") {
  // Both outputs feed the loss (cat), so grad_h and grad_y both reach backward.
  auto both = [](double eps) {
    return [eps](auto& t) {
      const AddRmsNorm o = add_rms_norm(t[0], t[1], t[2], eps);
      return cat({o.h, o.y}, -1);
    };
  };
  const Tensor x = normal({3, 5}, 61), r = normal({3, 5}, 62), w5 = normal({5}, 63);
  check_gradients(both(1e-5), {x, r, w5});
  check_gradients(both(0.3), {normal({2, 3, 6}, 64), normal({2, 3, 6}, 65), normal({6}, 66)});
  check_gradients(both(1e-5), {normal({4, 17}, 67), normal({4, 17}, 68), normal({17}, 69)});
  // Only y used (grad_h is the engine's zeros).
  check_gradients([](auto& t) { return add_rms_norm(t[0], t[1], t[2]).y; }, {x, r, w5});
  // Non-contiguous x: [6, 3] transposed to [3, 6].
  check_gradients([](auto& t) {
    const AddRmsNorm o = add_rms_norm(t[0].t(), t[1], t[2]);
    return cat({o.h, o.y}, -1);
  }, {normal({6, 3}, 70), normal({3, 6}, 71), normal({6}, 72)});
  // Subsets of the inputs need gradients.
  check_gradients(both(1e-5), {x, r, w5}, {.check = {true, false, false}});
  check_gradients(both(1e-5), {x, r, w5}, {.check = {false, true, false}});
  check_gradients(both(1e-5), {x, r, w5}, {.check = {false, false, true}});
  check_gradients(both(1e-5), {x, r, w5}, {.check = {true, true, false}});
}

TEST_CASE("add_rms_norm: backward gives the unfused graph's gradients", "[ops][norm][add_rms_norm][grad]") {
  // h with one other consumer (a decoder block's residual stream): the
  // gradients are the unfused graph's bits, dweight included.
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (const Shape& shape : std::vector<Shape>{{4, 16}, {3, 5, 37}, {300, 512}}) {
      INFO("dtype " << dt << ", shape " << shape_str(shape));
      const std::int64_t d = shape.back();
      const Tensor x = normal(shape, 81).to(dt), r = normal(shape, 82).to(dt), w = normal({d}, 83).to(dt);
      const Tensor gh = normal(shape, 84).to(dt), gy = normal(shape, 85).to(dt);
      Tensor xf = leaf(x), rf = leaf(r), wf = leaf(w);
      const AddRmsNorm o = add_rms_norm(xf, rf, wf);
      const auto g = grad({o.h, o.y}, {xf, rf, wf}, {gh, gy});
      Tensor xu = leaf(x), ru = leaf(r), wu = leaf(w);
      const Tensor hu = add(xu, ru), yu = rms_norm(hu, wu);
      const auto gu = grad({hu, yu}, {xu, ru, wu}, {gh, gy});
      CHECK(bits(o.h) == bits(hu));
      CHECK(bits(o.y) == bits(yu));
      for (std::size_t i = 0; i < 3; ++i) {
        INFO("gradient " << i);
        CHECK(g[i].dtype() == dt);
        CHECK(bits(g[i]) == bits(gu[i]));
      }
      // Only the weight needs a gradient (the path without dh).
      Tensor wo = leaf(w), wo2 = leaf(w);
      const AddRmsNorm o2 = add_rms_norm(x, r, wo);
      const auto gw = grad({o2.y}, {wo}, {gy});
      const auto gw2 = grad({rms_norm(add(x, r), wo2)}, {wo2}, {gy});
      CHECK(bits(gw[0]) == bits(gw2[0]));
    }
  }
  // Two other consumers of h, one recorded before the RMSNorm in the unfused
  // graph: the engine sums h's gradients in arrival order, (grad_h + dn) + dz
  // there, (grad_h + dz) + dn fused; only the order of that one final add
  // differs (a rounding of the last f32 add), dweight is exact.
  const Shape shape{64, 96};
  const Tensor x = normal(shape, 91), r = normal(shape, 92), w = normal({96}, 93);
  const Tensor gh = normal(shape, 94), gy = normal(shape, 95), gz = normal(shape, 96);
  Tensor xf = leaf(x), rf = leaf(r), wf = leaf(w);
  const AddRmsNorm o = add_rms_norm(xf, rf, wf);
  const Tensor zf = mul(o.h, 0.37);
  const auto g = grad({o.h, zf, o.y}, {xf, rf, wf}, {gh, gz, gy});
  Tensor xu = leaf(x), ru = leaf(r), wu = leaf(w);
  const Tensor hu = add(xu, ru);
  const Tensor zu = mul(hu, 0.37);
  const Tensor yu = rms_norm(hu, wu);
  const auto gu = grad({hu, zu, yu}, {xu, ru, wu}, {gh, gz, gy});
  for (std::size_t i = 0; i < 2; ++i) {
    const auto a = g[i].to_vector<float>(), b = gu[i].to_vector<float>();
    REQUIRE(a.size() == b.size());
    for (std::size_t k = 0; k < a.size(); ++k) CHECK(a[k] == Approx(b[k]).epsilon(1e-6).margin(1e-6));
  }
  CHECK(bits(g[2]) == bits(gu[2]));
}

TEST_CASE("add_rms_norm does not depend on the thread count", "[ops][norm][add_rms_norm]") {
  const int threads = num_threads();
  // [1000, 512]: 8 weight-gradient blocks of 128 rows; [4000, 37] bf16: 3 of 1771.
  for (auto [shape, dt] : std::vector<std::pair<Shape, DType>>{{{1000, 512}, DType::f32},
                                                               {{4000, 37}, DType::bf16}}) {
    INFO("dtype " << dt << ", shape " << shape_str(shape));
    const std::int64_t d = shape.back();
    const Tensor x = normal(shape, 101).to(dt), r = normal(shape, 102).to(dt), w = normal({d}, 103).to(dt);
    const Tensor gh = normal(shape, 104).to(dt), gy = normal(shape, 105).to(dt);
    auto run = [&](int n) {
      set_num_threads(n);
      Tensor xx = leaf(x), rr = leaf(r), ww = leaf(w);
      const AddRmsNorm o = add_rms_norm(xx, rr, ww);
      const auto g = grad({o.h, o.y}, {xx, rr, ww}, {gh, gy});
      return std::vector<std::vector<std::uint32_t>>{bits(o.h), bits(o.y), bits(g[0]), bits(g[1]), bits(g[2])};
    };
    const auto one = run(1), two = run(2), three = run(3);
    for (std::size_t i = 0; i < one.size(); ++i) {
      INFO("result " << i);
      CHECK(one[i] == two[i]);
      CHECK(one[i] == three[i]);
    }
  }
  set_num_threads(threads);
}

TEST_CASE("add_rms_norm saves what the unfused pair saves and frees it after backward",
          "[ops][norm][add_rms_norm][memory]") {
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO("dtype " << dt);
    const std::int64_t live0 = saved_bytes_live();
    const std::int64_t op0 = op_bytes(saved_bytes_report(), "add_rms_norm");
    const Tensor x0 = normal({4, 6, 32}, 111).to(dt), r0 = normal({4, 6, 32}, 112).to(dt);
    const Tensor w0 = normal({32}, 113).to(dt);
    const std::int64_t rows = 24;
    // h, weight and one f32 per row.
    const std::int64_t expect = std::int64_t(x0.nbytes() + w0.nbytes()) + 4 * rows;
    Tensor x = leaf(x0), r = leaf(r0), w = leaf(w0);
    {
      const AddRmsNorm o = add_rms_norm(x, r, w);
      const auto rep = saved_bytes_report();
      CHECK(rep.live_bytes - live0 == expect);
      CHECK(op_bytes(rep, "add_rms_norm") - op0 == expect);
      backward({o.h, o.y}, {ones(o.h.sizes(), dt), ones(o.y.sizes(), dt)});
    }
    CHECK(saved_bytes_live() == live0);
    CHECK(op_bytes(saved_bytes_report(), "add_rms_norm") == op0);
    CHECK(x.grad().defined());
    CHECK(r.grad().defined());
    CHECK(w.grad().defined());
    {  // The unfused pair saves the same bytes.
      Tensor xu = leaf(x0), ru = leaf(r0), wu = leaf(w0);
      const Tensor y = rms_norm(add(xu, ru), wu);
      CHECK(saved_bytes_live() - live0 == expect);
    }
    {  // Only the weight needs a gradient: no weight saved.
      const AddRmsNorm o = add_rms_norm(x0, r0, w);
      CHECK(saved_bytes_live() - live0 == std::int64_t(x0.nbytes()) + 4 * rows);
    }
    CHECK(saved_bytes_live() == live0);
  }
}

TEST_CASE("add_rms_norm rejects bad operands with clear messages", "[ops][norm][add_rms_norm]") {
  const Tensor x = zeros({2, 4}), w = zeros({4});
  CHECK_THROWS_WITH(add_rms_norm(x, zeros({2, 3}), w),
                    Catch::Contains("add_rms_norm: residual [2, 3] f32 cpu must have x's shape (x [2, 4] "
                                    "f32 cpu; h = x + residual does not broadcast)"));
  CHECK_THROWS_AS(add_rms_norm(x, zeros({4}), w), ShapeError);
  CHECK_THROWS_WITH(add_rms_norm(x, zeros({2, 4}, DType::bf16), w),
                    Catch::Contains("add_rms_norm: residual [2, 4] bf16 cpu must have x's dtype (x [2, 4] f32 cpu)"));
  CHECK_THROWS_AS(add_rms_norm(x, zeros({2, 4}, DType::bf16), w), DTypeError);
  CHECK_THROWS_WITH(add_rms_norm(x, Tensor(), w), Catch::Contains("add_rms_norm: residual is an undefined tensor"));
  CHECK_THROWS_WITH(add_rms_norm(x, x, zeros({3})),
                    Catch::Contains("add_rms_norm: weight must be [4] (the input's last dim), got [3] f32 cpu"));
  CHECK_THROWS_WITH(add_rms_norm(x, x, zeros({2, 4})),
                    Catch::Contains("add_rms_norm: weight must be [4] (the input's last dim), got [2, 4] f32 cpu"));
  CHECK_THROWS_WITH(add_rms_norm(x, x, zeros({4}, DType::bf16)),
                    Catch::Contains("add_rms_norm: weight [4] bf16 cpu must have the input's dtype"));
  CHECK_THROWS_WITH(add_rms_norm(x, x, Tensor()), Catch::Contains("add_rms_norm: weight is an undefined tensor"));
  CHECK_THROWS_WITH(add_rms_norm(zeros({2, 4}, DType::i32), zeros({2, 4}, DType::i32), w),
                    Catch::Contains("add_rms_norm: x must be floating"));
  CHECK_THROWS_WITH(add_rms_norm(zeros({}), zeros({}), zeros({1})),
                    Catch::Contains("add_rms_norm: x must have at least 1 dim"));
}
