#include <catch2/catch.hpp>

#include "engine/parallel_for.h"
#include "ops/index.h"
#include "ops/ops.h"
#include "tests/ops/gradcheck.h"

using namespace remat;
using namespace remat::testing;

namespace {

Tensor idx64(const std::vector<std::int64_t>& v, Shape s = {}) { return from_vector<std::int64_t>(v, s); }
Tensor idx32(const std::vector<std::int32_t>& v, Shape s = {}) { return from_vector<std::int32_t>(v, s); }

// Runs fn with `n` kernel threads, restoring the previous count.
template <typename Fn>
auto with_threads(int n, Fn&& fn) {
  const int before = num_threads();
  set_num_threads(n);
  auto r = fn();
  set_num_threads(before);
  return r;
}

}  // namespace

TEST_CASE("index_select forward values", "[ops][index]") {
  Tensor x = arange(0.0, 12.0, 1.0).view({3, 4});
  CHECK(index_select(x, 0, idx64({2, 0, 2})).to_vector<float>() ==
        std::vector<float>{8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11});
  Tensor c = index_select(x, 1, idx32({3, 1}));
  CHECK(c.sizes() == Shape{3, 2});
  CHECK(c.to_vector<float>() == std::vector<float>{3, 1, 7, 5, 11, 9});
  CHECK(index_select(x, -1, idx64({})).sizes() == Shape{3, 0});
  CHECK(index_select(x, 0, full({}, 1.0, DType::i64)).sizes() == Shape{1, 4});
  // Non-contiguous input and index.
  Tensor xt = x.t();  // [4, 3]
  CHECK(index_select(xt, 1, idx64({0, 9, 2, 9}).slice(0, 0, 4, 2)).to_vector<float>() ==
        std::vector<float>{0, 8, 1, 9, 2, 10, 3, 11});
  // Any dtype is copied exactly.
  Tensor xi = from_vector<std::int64_t>({10, 20, 30, 40}, {2, 2});
  CHECK(index_select(xi, 1, idx64({1, 1, 0})).to_vector<std::int64_t>() ==
        std::vector<std::int64_t>{20, 20, 10, 40, 40, 30});
  Tensor xb = index_select(x.to(DType::bf16), 0, idx64({1}));
  CHECK(xb.dtype() == DType::bf16);
  CHECK(xb.to_vector<float>() == std::vector<float>{4, 5, 6, 7});
  Tensor x3 = arange(0.0, 24.0, 1.0).view({2, 3, 4});
  CHECK(index_select(x3, 1, idx64({2, 0})).to_vector<float>() ==
        std::vector<float>{8, 9, 10, 11, 0, 1, 2, 3, 20, 21, 22, 23, 12, 13, 14, 15});
}

TEST_CASE("gather forward values (torch.gather semantics)", "[ops][index]") {
  Tensor x = arange(0.0, 12.0, 1.0).view({3, 4});
  // dim 1: out[i][j] = x[i][index[i][j]].
  Tensor g1 = gather(x, 1, idx64({3, 0, 1, 1, 2, 2}, {3, 2}));
  CHECK(g1.sizes() == Shape{3, 2});
  CHECK(g1.to_vector<float>() == std::vector<float>{3, 0, 5, 5, 10, 10});
  // dim 0: out[i][j] = x[index[i][j]][j]; index narrower than x in dim 1.
  Tensor g0 = gather(x, 0, idx32({2, 0, 1, 0, 0, 2}, {2, 3}));
  CHECK(g0.to_vector<float>() == std::vector<float>{8, 1, 6, 0, 1, 10});
  // Index longer than x along dim (repeats), non-contiguous x.
  Tensor xt = x.t();  // [4, 3]
  Tensor gt = gather(xt, 1, idx64({2, 2, 2, 2, 0, 1, 0, 1}, {2, 4}));
  CHECK(gt.to_vector<float>() == std::vector<float>{8, 8, 8, 8, 1, 5, 1, 5});
  // Non-contiguous index.
  Tensor it = idx64({1, 0, 0, 1, 1, 0}, {2, 3}).t();  // [3, 2]: 1 1 / 0 1 / 0 0
  CHECK(gather(x, 1, it).to_vector<float>() == std::vector<float>{1, 1, 4, 5, 8, 8});
  // 3-D against a reference loop.
  Tensor x3 = normal({3, 4, 5}, 11);
  std::vector<std::int64_t> iv(3 * 6 * 5);
  for (std::size_t k = 0; k < iv.size(); ++k) iv[k] = std::int64_t((k * 7 + 3) % 4);
  Tensor i3 = idx64(iv, {3, 6, 5});
  Tensor g3 = gather(x3, 1, i3);
  CHECK(g3.sizes() == Shape{3, 6, 5});
  const auto xv = x3.to_vector<float>(), gv = g3.to_vector<float>();
  bool ok = true;
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 6; ++b)
      for (int c = 0; c < 5; ++c) {
        const auto j = iv[std::size_t((a * 6 + b) * 5 + c)];
        ok = ok && gv[std::size_t((a * 6 + b) * 5 + c)] == xv[std::size_t((a * 4 + j) * 5 + c)];
      }
  CHECK(ok);
  CHECK(gather(from_vector<std::int32_t>({5, 6, 7}), 0, idx64({2, 0})).to_vector<std::int32_t>() ==
        std::vector<std::int32_t>{7, 5});
}

TEST_CASE("scatter_add and index_add accumulate repeated indices", "[ops][index]") {
  Tensor x = ones({3, 4});
  const auto x_version = x.version();
  Tensor src = arange(1.0, 7.0, 1.0).view({2, 3});  // 1 2 3 / 4 5 6
  // dim 0: out[index[i][j]][j] += src[i][j]; index [2, 2] narrower than src.
  Tensor s0 = scatter_add(x, 0, idx64({2, 2, 2, 0}, {2, 2}), src);
  CHECK(s0.to_vector<float>() == std::vector<float>{1, 6, 1, 1, 1, 1, 1, 1, 6, 3, 1, 1});
  // dim 1 with every entry of a row hitting one slot.
  Tensor s1 = scatter_add(zeros({2, 4}), 1, idx64({3, 3, 3, 0, 1, 0}, {2, 3}), src);
  CHECK(s1.to_vector<float>() == std::vector<float>{0, 0, 0, 6, 10, 5, 0, 0});
  // The input is not modified.
  CHECK(x.to_vector<float>() == std::vector<float>(12, 1.0f));
  CHECK(x.version() == x_version);

  // index_add: out[:, index[j]] += src[:, j].
  Tensor ia = index_add(x, 1, idx32({1, 3, 1}), arange(1.0, 10.0, 1.0).view({3, 3}));
  CHECK(ia.to_vector<float>() == std::vector<float>{1, 5, 1, 3, 1, 11, 1, 6, 1, 17, 1, 9});
  Tensor ib = index_add(zeros({3, 2}), 0, idx64({2, 2, 0}), src.t());  // src.t(): 1 4 / 2 5 / 3 6
  CHECK(ib.to_vector<float>() == std::vector<float>{3, 6, 0, 0, 3, 9});
  // 16-bit dtypes accumulate in f32 and round once.
  Tensor hb = index_add(zeros({1}, DType::bf16), 0, idx64({0, 0, 0}),
                        from_vector<float>({256, 1, 1}).to(DType::bf16));
  CHECK(hb.dtype() == DType::bf16);
  CHECK(hb.item() == 258.0);
}

TEST_CASE("scatter_add/index_add results do not depend on the thread count", "[ops][index]") {
  // Many repeated indices along a long dim, summed in index order in f32.
  const std::int64_t rows = 4000, cols = 33, buckets = 5;
  Tensor src = normal({rows, cols}, 12, 100.0);
  std::vector<std::int64_t> iv(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) iv[std::size_t(r)] = (r * r + 3) % buckets;
  Tensor index = idx64(iv);
  const auto sv = src.to_vector<float>();
  std::vector<float> ref(std::size_t(buckets * cols), 0.0f);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      ref[std::size_t(iv[std::size_t(r)] * cols + c)] += sv[std::size_t(r * cols + c)];
  auto run_index_add = [&] { return index_add(zeros({buckets, cols}), 0, index, src).to_vector<float>(); };
  CHECK(with_threads(1, run_index_add) == ref);
  CHECK(with_threads(2, run_index_add) == ref);
  CHECK(with_threads(7, run_index_add) == ref);
  Tensor full_index = index.view({rows, 1}).expand({rows, cols}).contiguous();
  auto run_scatter = [&] { return scatter_add(zeros({buckets, cols}), 0, full_index, src).to_vector<float>(); };
  CHECK(with_threads(1, run_scatter) == ref);
  CHECK(with_threads(3, run_scatter) == ref);
  // A 1-D scatter (no dims besides the indexed one) too.
  auto run_1d = [&] { return scatter_add(zeros({buckets}), 0, index, src.select(1, 0).contiguous()).to_vector<float>(); };
  const auto r1 = with_threads(1, run_1d);
  CHECK(with_threads(4, run_1d) == r1);
  for (std::int64_t b = 0; b < buckets; ++b) CHECK(r1[std::size_t(b)] == ref[std::size_t(b * cols)]);
}

TEST_CASE("index ops reject bad operands with clear messages", "[ops][index]") {
  Tensor x = zeros({3, 4});
  CHECK_THROWS_WITH(index_select(x, 1, idx64({0, 4})),
                    Catch::Contains("index_select: index 4 (at position [1] of index [2] i64 cpu) is "
                                    "out of range for dim 1 of size 4 (input [3, 4] f32 cpu)"));
  CHECK_THROWS_WITH(index_select(x, 0, idx32({-1})), Catch::Contains("index_select: index -1"));
  CHECK_THROWS_AS(index_select(x, 0, idx32({-1})), ShapeError);
  CHECK_THROWS_WITH(index_select(x, 0, zeros({2})),
                    Catch::Contains("index_select: index must be an index tensor (i32 or i64), got [2] f32 cpu"));
  CHECK_THROWS_WITH(index_select(x, 0, idx64({0, 1}, {1, 2})),
                    Catch::Contains("index_select: index must be 1-D, got [1, 2] i64 cpu"));
  CHECK_THROWS_WITH(index_select(x, 2, idx64({0})), Catch::Contains("index_select: dim 2 is out of range"));
  CHECK_THROWS_WITH(gather(x, 1, idx64({0, 7}, {1, 2})),
                    Catch::Contains("gather: index 7 (at position [0, 1] of index [1, 2] i64 cpu) is "
                                    "out of range for dim 1 of size 4"));
  CHECK_THROWS_WITH(gather(x, 1, idx64({0, 1}, {2})),
                    Catch::Contains("gather: index [2] i64 cpu must have as many dims as the input [3, 4] f32 cpu"));
  CHECK_THROWS_WITH(gather(x, 1, idx64({0, 0, 0, 0}, {4, 1})),
                    Catch::Contains("gather: index [4, 1] i64 cpu is larger than the input [3, 4] f32 cpu in dim 0"));
  CHECK_THROWS_WITH(scatter_add(x, 0, idx64({0, 0}, {1, 2}), zeros({1, 1})),
                    Catch::Contains("scatter_add: index [1, 2] i64 cpu is larger than src [1, 1] f32 cpu in dim 1"));
  CHECK_THROWS_WITH(scatter_add(x, 0, idx64({3}, {1, 1}), zeros({1, 1})),
                    Catch::Contains("scatter_add: index 3 (at position [0, 0] of index [1, 1] i64 cpu) is "
                                    "out of range for dim 0 of size 3"));
  CHECK_THROWS_WITH(scatter_add(x, 0, idx64({0}, {1, 1}), zeros({1, 1}, DType::bf16)),
                    Catch::Contains("scatter_add: operands have different dtypes"));
  CHECK_THROWS_WITH(scatter_add(zeros({2}, DType::i64), 0, idx64({0}), zeros({1}, DType::i64)),
                    Catch::Contains("scatter_add: input must be floating"));
  CHECK_THROWS_WITH(index_add(x, 1, idx64({0, 1}), zeros({3, 3})),
                    Catch::Contains("index_add: src [3, 3] f32 cpu must have shape [3, 2]"));
  CHECK_THROWS_WITH(index_add(x, 0, idx64({5}, {1}), zeros({1, 4})),
                    Catch::Contains("index_add: index 5 (at position [0] of index [1] i64 cpu) is out "
                                    "of range for dim 0 of size 3"));
}

TEST_CASE("index ops: gradients match finite differences", "[ops][index][grad]") {
  const Tensor x = normal({4, 5}, 31);
  const Tensor rep = idx64({3, 0, 3, 3, 1});  // repeated indices accumulate in backward
  check_gradients([](auto& t) { return index_select(t[0], 0, t[1]); }, {x, rep});
  check_gradients([](auto& t) { return index_select(t[0], 1, t[1]); }, {x, idx32({4, 4, 0})});
  check_gradients([](auto& t) { return index_select(t[0].t(), 0, t[1]); }, {x, rep});

  const Tensor gi = idx64({0, 0, 2, 3, 1, 1, 3, 3, 2, 0, 0, 1}, {3, 4});  // narrower than x in dim 1
  check_gradients([](auto& t) { return gather(t[0], 0, t[1]); }, {x, gi});
  check_gradients([](auto& t) { return gather(t[0], 1, t[1]); }, {x, gi});
  check_gradients([](auto& t) { return gather(t[0].t(), 1, t[1]); }, {normal({5, 4}, 32), gi});
  check_gradients([](auto& t) { return gather(t[0], 2, t[1]); },
                  {normal({2, 3, 4}, 33), idx64({3, 1, 1, 0, 2, 2, 0, 3, 1, 1, 2, 0}, {2, 3, 2})});

  const Tensor si = idx64({1, 3, 3, 0, 1, 1}, {2, 3});
  check_gradients([](auto& t) { return scatter_add(t[0], 1, t[1], t[2]); },
                  {x, si, normal({2, 4}, 34)});  // src wider than index: its extra column gets 0
  check_gradients([](auto& t) { return scatter_add(t[0], 0, t[1], t[2]); },
                  {x, idx64({3, 3, 0, 3, 2, 3, 3, 1}, {2, 4}), normal({5, 4}, 35).t()});
  check_gradients([](auto& t) { return index_add(t[0], 1, t[1], t[2]); },
                  {x, idx64({4, 0, 4}), normal({4, 3}, 36)});
  check_gradients([](auto& t) { return index_add(t[0].t(), 0, t[1], t[2] * t[2]); },
                  {normal({5, 4}, 37), idx32({3, 0, 3}), normal({3, 5}, 38)});
}

TEST_CASE("index ops save only the index, and only when a gradient needs it", "[ops][index][grad]") {
  Tensor x = normal({4, 3}, 41).set_requires_grad();
  Tensor src = normal({2, 3}, 42);
  Tensor i = idx64({1, 1});
  Tensor y = index_add(x, 0, i, src);
  REQUIRE(y.grad_fn() != nullptr);
  CHECK(y.grad_fn()->saved_tensors().size() == 1);
  CHECK(!y.grad_fn()->saved_tensors()[0]->defined());  // dx = g needs no index
  Tensor z = gather(x, 0, idx64({0, 3}, {1, 2}));
  CHECK(z.grad_fn()->saved_tensors().size() == 1);
  CHECK(z.grad_fn()->saved_tensors()[0]->info().meta.dtype == DType::i64);
  // Modifying the saved index in place is caught at backward.
  Tensor gi = idx64({0, 3}, {1, 2});
  Tensor w = gather(x, 0, gi);
  gi.set({0, 0}, 1);
  CHECK_THROWS_WITH(sum(w).backward(), Catch::Contains("saved by op 'gather'"));
}
