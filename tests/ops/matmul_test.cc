#include <catch2/catch.hpp>

#include <cblas.h>
#include <dlfcn.h>

#include "engine/parallel_for.h"
#include "ops/gemm.h"
#include "ops/ops.h"
#include "tests/ops/gradcheck.h"

using namespace remat;
using namespace remat::testing;

namespace {
// Reference product in double.
std::vector<double> ref_matmul(const Tensor& a, const Tensor& b) {
  const auto m = a.size(0), k = a.size(1), n = b.size(1);
  std::vector<double> out(std::size_t(m * n), 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t p = 0; p < k; ++p) out[std::size_t(i * n + j)] += a.at({i, p}) * b.at({p, j});
  return out;
}

void check_close(const Tensor& got, const std::vector<double>& want) {
  const auto g = got.to_vector<float>();
  REQUIRE(g.size() == want.size());
  for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == Approx(want[i]).margin(1e-4).epsilon(1e-5));
}
}  // namespace

TEST_CASE("the openblas back end is OpenBLAS: BLIS's archive does not shadow its cblas_sgemm", "[ops][matmul]") {
  Dl_info info{};
  REQUIRE(dladdr(reinterpret_cast<void*>(&cblas_sgemm), &info) != 0);
  REQUIRE(info.dli_fname != nullptr);
  INFO("cblas_sgemm comes from " << info.dli_fname);
  CHECK(std::string(info.dli_fname).find("libopenblas") != std::string::npos);
}

TEST_CASE("matmul matches a reference, for every operand layout and every GEMM back end",
          "[ops][matmul]") {
  const ops_detail::GemmBackend initial = ops_detail::gemm_backend();
  for (auto backend : {ops_detail::GemmBackend::eigen, ops_detail::GemmBackend::openblas,
                       ops_detail::GemmBackend::blis}) {
    ops_detail::set_gemm_backend(backend);
    const Tensor a = normal({7, 5}, 1), b = normal({5, 6}, 2);
    const auto want = ref_matmul(a, b);
    check_close(matmul(a, b), want);
    check_close(matmul(a.t().contiguous().t(), b), want);          // transposed A
    check_close(matmul(a, b.t().contiguous().t()), want);          // transposed B
    check_close(matmul(a.t().contiguous().t(), b.t().contiguous().t()), want);
    check_close(matmul(a.narrow(1, 0, 5), b.narrow(0, 0, 5)), want);
    // Row-strided views (lda > k).
    Tensor wide = normal({7, 9}, 3);
    Tensor av = wide.narrow(1, 2, 5);
    check_close(matmul(av, b), ref_matmul(av.contiguous(), b));
  }
  ops_detail::set_gemm_backend(initial);
  // Leading dims fold; batched products.
  Tensor x = normal({2, 3, 5}, 4), w = normal({5, 4}, 5);
  Tensor y = matmul(x, w);
  CHECK(y.sizes() == Shape{2, 3, 4});
  check_close(y.select(0, 1), ref_matmul(x.select(0, 1).contiguous(), w));
  Tensor bb = normal({2, 5, 4}, 6);
  Tensor z = bmm(x, bb);
  check_close(z.select(0, 1), ref_matmul(x.select(0, 1).contiguous(), bb.select(0, 1).contiguous()));
  Tensor zt = bmm(x, bb.transpose(1, 2).contiguous().transpose(1, 2));
  check_close(zt.select(0, 0), ref_matmul(x.select(0, 0).contiguous(), bb.select(0, 0).contiguous()));
  // A size-1 batch dim whose stride is not the batch step (unsqueeze of a
  // batch-strided view): the batch stride comes from the outer dim.
  Tensor x4 = normal({4, 2, 3, 5}, 10);
  Tensor a41 = x4.select(1, 0).unsqueeze(1);  // [4, 1, 3, 5], strides [30, 15, 5, 1]
  Tensor b41 = normal({4, 1, 5, 4}, 11);
  Tensor z41 = matmul(a41, b41);
  for (std::int64_t i = 0; i < 4; ++i)
    check_close(z41.select(0, i).select(0, 0), ref_matmul(a41.select(0, i).select(0, 0).contiguous(),
                                                          b41.select(0, i).select(0, 0).contiguous()));
  CHECK_THROWS_WITH(matmul(zeros({2, 3}), zeros({4, 5})),
                    Catch::Contains("matmul: inner dims differ: [2, 3] f32 cpu @ [4, 5] f32 cpu"));
  CHECK_THROWS_AS(bmm(zeros({2, 3, 4}), zeros({3, 4, 5})), ShapeError);
}

TEST_CASE("linear = x w^T + b", "[ops][matmul]") {
  Tensor x = normal({4, 3}, 7), w = normal({5, 3}, 8), b = normal({5}, 9);
  Tensor y = linear(x, w, b);
  auto want = ref_matmul(x, w.t().contiguous());
  for (std::int64_t i = 0; i < 4; ++i)
    for (std::int64_t j = 0; j < 5; ++j) want[std::size_t(i * 5 + j)] += b.at({j});
  check_close(y, want);
  CHECK_THROWS_WITH(linear(x, zeros({5, 4})), Catch::Contains("linear: input [4, 3] f32 cpu does not match weight"));
}

TEST_CASE("matmul and linear: gradients match finite differences", "[ops][matmul][grad]") {
  check_gradients([](auto& t) { return matmul(t[0], t[1]); }, {normal({3, 4}, 1), normal({4, 2}, 2)});
  check_gradients([](auto& t) { return matmul(t[0], t[1].t()); }, {normal({3, 4}, 3), normal({2, 4}, 4)});
  check_gradients([](auto& t) { return matmul(t[0].t(), t[1]); }, {normal({4, 3}, 5), normal({4, 2}, 6)});
  check_gradients([](auto& t) { return matmul(t[0], t[1]); }, {normal({2, 3, 4}, 7), normal({4, 2}, 8)});
  check_gradients([](auto& t) { return bmm(t[0], t[1]); }, {normal({2, 3, 4}, 9), normal({2, 4, 2}, 10)});
  check_gradients([](auto& t) { return bmm(t[0], t[1].transpose(1, 2)); },
                  {normal({2, 3, 4}, 11), normal({2, 2, 4}, 12)});
  check_gradients([](auto& t) { return linear(t[0], t[1], t[2]); },
                  {normal({2, 3, 4}, 13), normal({5, 4}, 14), normal({5}, 15)});
}

TEST_CASE("linear's weight gradient is computed in the weight's layout: contiguous, equal to g^T x", "[ops][matmul][grad]") {
  Tensor x = normal({2, 3, 4}, 21), w = normal({5, 4}, 22), g = normal({2, 3, 5}, 23);
  w.set_requires_grad(true);
  Tensor y = linear(x, w);
  Tensor dw = grad({y}, {w}, {g})[0];
  CHECK(dw.is_contiguous());
  std::vector<double> want(20, 0.0);  // dw[o][i] = sum over rows r of g[r][o] * x[r][i]
  const Tensor x2 = x.reshape({6, 4}), g2 = g.reshape({6, 5});
  for (std::int64_t o = 0; o < 5; ++o)
    for (std::int64_t i = 0; i < 4; ++i)
      for (std::int64_t r = 0; r < 6; ++r) want[std::size_t(o * 4 + i)] += g2.at({r, o}) * x2.at({r, i});
  check_close(dw, want);
  // backward() accumulates it into .grad (twice: the sum).
  linear(x, w).backward(g);
  linear(x, w).backward(g);
  for (double& v : want) v *= 2;
  check_close(w.grad(), want);
}

TEST_CASE("a product's two gradients, computed side by side, do not depend on the thread count", "[ops][matmul][grad]") {
  // linear (w stored transposed in the product) and a plain matmul, at GEMM-sized shapes.
  Tensor x = normal({3, 70, 96}, 31), w = normal({80, 96}, 32), g = normal({3, 70, 80}, 33);
  Tensor b = normal({96, 80}, 34);
  auto grads = [&](int threads) {
    set_num_threads(threads);
    Tensor xs = x.detach(), ws = w.detach(), bs = b.detach();
    xs.set_requires_grad(true);
    ws.set_requires_grad(true);
    bs.set_requires_grad(true);
    auto lin = grad({linear(xs, ws)}, {xs, ws}, {g});
    auto mm = grad({matmul(xs, bs)}, {xs, bs}, {g});
    return std::vector<Tensor>{lin[0], lin[1], mm[0], mm[1]};
  };
  const int threads = num_threads();
  const auto one = grads(1), two = grads(2), three = grads(3);
  set_num_threads(threads);
  for (std::size_t i = 0; i < one.size(); ++i) {
    INFO("gradient " << i);
    CHECK(one[i].to_vector<float>() == two[i].to_vector<float>());
    CHECK(one[i].to_vector<float>() == three[i].to_vector<float>());
  }
  // And they are the products: dX = g w, dW = g^T x.
  const Tensor x2 = x.reshape({210, 96}), g2 = g.reshape({210, 80});
  std::vector<double> dw(80 * 96, 0.0);
  for (std::int64_t o = 0; o < 80; ++o)
    for (std::int64_t r = 0; r < 210; ++r) {
      const double gr = g2.at({r, o});
      for (std::int64_t i = 0; i < 96; ++i) dw[std::size_t(o * 96 + i)] += gr * x2.at({r, i});
    }
  check_close(one[1], dw);
}
