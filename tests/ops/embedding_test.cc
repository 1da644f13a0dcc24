#include <catch2/catch.hpp>

#include <string>

#include "engine/parallel_for.h"
#include "ops/embedding.h"
#include "ops/ops.h"
#include "tests/ops/gradcheck.h"

using namespace remat;
using namespace remat::testing;

TEST_CASE("embedding gathers rows", "[ops][embedding]") {
  const Tensor w = arange(0.0, 24.0, 1.0).view({6, 4});
  Tensor y = embedding(w, from_vector<std::int64_t>({5, 0, 5, 2}, {2, 2}));
  CHECK(y.sizes() == Shape{2, 2, 4});
  CHECK(y.to_vector<float>() == std::vector<float>{20, 21, 22, 23, 0, 1, 2, 3,
                                                   20, 21, 22, 23, 8, 9, 10, 11});
  // i32 ids, a 0-dim id, a non-contiguous table and non-contiguous ids.
  CHECK(embedding(w, from_vector<std::int32_t>({1})).to_vector<float>() == std::vector<float>{4, 5, 6, 7});
  CHECK(embedding(w, full({}, 3.0, DType::i64)).sizes() == Shape{4});
  const Tensor wt = w.t().contiguous();  // [4, 6]
  CHECK(embedding(wt.t(), from_vector<std::int64_t>({2})).to_vector<float>() ==
        std::vector<float>{8, 9, 10, 11});
  const Tensor ids = from_vector<std::int64_t>({0, 1, 2, 3, 4, 5}, {2, 3});
  CHECK(embedding(w, ids.t()).select(0, 0).select(0, 1).to_vector<float>() ==
        std::vector<float>{12, 13, 14, 15});
  // 16-bit tables keep their dtype (an exact copy).
  Tensor h = embedding(w.to(DType::bf16), from_vector<std::int64_t>({4}));
  CHECK(h.dtype() == DType::bf16);
  CHECK(h.to_vector<float>() == std::vector<float>{16, 17, 18, 19});
  // Empty ids.
  CHECK(embedding(w, zeros({0}, DType::i64)).sizes() == Shape{0, 4});
}

TEST_CASE("embedding: gradients match finite differences", "[ops][embedding][grad]") {
  const Tensor w = normal({6, 4}, 1);
  // Repeated ids: their gradients add up.
  const Tensor ids = from_vector<std::int64_t>({1, 3, 1, 1, 5, 0}, {2, 3});
  check_gradients([](auto& x) { return embedding(x[0], x[1]); }, {w, ids});
  check_gradients([](auto& x) { return embedding(x[0], x[1]); },
                  {w, from_vector<std::int32_t>({2, 2, 2})});
  // Non-contiguous table ([4, 6] leaf used as [6, 4]) and non-contiguous ids.
  check_gradients([](auto& x) { return embedding(x[0].t(), x[1]); }, {normal({4, 6}, 2), ids});
  check_gradients([](auto& x) { return embedding(x[0], x[1].t()) * sum(x[0]); }, {w, ids});

  // Exact: d/dw sum(embedding(w, ids)) counts each row's uses.
  Tensor wl = w.detach().set_requires_grad();
  sum(embedding(wl, ids)).backward();
  const std::vector<float> counts{1, 3, 0, 1, 0, 1};
  const auto g = wl.grad().to_vector<float>();
  for (std::size_t r = 0; r < 6; ++r)
    for (std::size_t j = 0; j < 4; ++j) CHECK(g[r * 4 + j] == counts[r]);
}

TEST_CASE("embedding saves only its ids", "[ops][embedding][memory]") {
  const std::int64_t live0 = saved_bytes_live();
  Tensor w = normal({100, 16}, 3).set_requires_grad();
  const Tensor ids = from_vector<std::int32_t>({4, 8, 15, 16, 23, 42}, {2, 3});
  {
    Tensor y = embedding(w, ids);
    CHECK(saved_bytes_live() - live0 == std::int64_t(ids.nbytes()));
    CHECK(op_bytes(saved_bytes_report(), "embedding") == std::int64_t(ids.nbytes()));
    backward({y}, {ones(y.sizes())});
  }
  CHECK(saved_bytes_live() == live0);
}

TEST_CASE("embedding gradients do not depend on the thread count", "[ops][embedding]") {
  const int threads = num_threads();
  const Tensor w = normal({50, 64}, 4);
  std::vector<std::int64_t> iv(4000);
  for (std::size_t i = 0; i < iv.size(); ++i) iv[i] = std::int64_t((i * i + 7 * i) % 37);
  const Tensor ids = from_vector<std::int64_t>(iv, {40, 100});
  const Tensor r = normal({40, 100, 64}, 5);
  auto run = [&](int n) {
    set_num_threads(n);
    Tensor wl = w.detach().set_requires_grad();
    backward({embedding(wl, ids)}, {r});
    return wl.grad().to_vector<float>();
  };
  const auto a = run(1), b = run(3), c = run(2);
  CHECK(a == b);
  CHECK(a == c);
  set_num_threads(threads);
  // And they sum each row's gradients in id order (exactly what a serial loop gives).
  std::vector<float> want(50 * 64, 0.0f);
  const auto rv = r.to_vector<float>();
  for (std::size_t k = 0; k < iv.size(); ++k)
    for (std::size_t j = 0; j < 64; ++j) want[std::size_t(iv[k]) * 64 + j] += rv[k * 64 + j];
  CHECK(a == want);
}

TEST_CASE("embedding rejects bad operands with clear messages", "[ops][embedding]") {
  const Tensor w = zeros({10, 4});
  CHECK_THROWS_WITH(embedding(w, from_vector<std::int64_t>({3, 12})),
                    Catch::Contains("embedding: id 12 at position 1 is out of range for a table of 10 rows"));
  CHECK_THROWS_WITH(embedding(w, from_vector<std::int32_t>({-1})),
                    Catch::Contains("embedding: id -1 at position 0 is out of range for a table of 10 rows"));
  CHECK_THROWS_WITH(embedding(w, zeros({2})),
                    Catch::Contains("embedding: ids must be an index tensor (i32 or i64), got [2] f32 cpu"));
  CHECK_THROWS_WITH(embedding(zeros({10}), zeros({2}, DType::i64)),
                    Catch::Contains("embedding: weight must be [V, d], got [10] f32 cpu"));
  CHECK_THROWS_WITH(embedding(zeros({10, 4}, DType::i64), zeros({2}, DType::i64)),
                    Catch::Contains("embedding: weight must be floating"));
}
