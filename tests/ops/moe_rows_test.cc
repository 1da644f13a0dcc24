// The MoE row kernels (ops/moe_rows.h) on the CPU, against values worked out
// by hand. The CUDA kernels are checked against these in tests/cuda/moe_test.cc.
// The kernels are called as the CPU's kernel table runs them (floating
// operands staged to f32).
#include <catch2/catch.hpp>

#include "engine/error.h"
#include "engine/parallel_for.h"
#include "ops/moe_rows.h"
#include "ops/ops.h"

using namespace remat;

namespace {
const KernelTable<MoeRowsKernels>& k = moe_rows_kernels();
void gather_rows(Tensor& out, const Tensor& x, const Tensor& idx, const Tensor& w) {
  k.run(kCPU, &MoeRowsKernels::gather_rows, out, x, idx, w);
}
Tensor sum_rows(const Tensor& y, const Tensor& w, const Tensor& token_of_row, std::int64_t tokens, DType dtype) {
  return k.run(kCPU, &MoeRowsKernels::sum_rows, y, w, token_of_row, tokens, 1, dtype).to(dtype);
}
Tensor i64(const std::vector<std::int64_t>& v) { return from_vector<std::int64_t>(v, {std::int64_t(v.size())}); }
Tensor f32(const std::vector<float>& v, Shape s) { return from_vector<float>(v, s); }
}  // namespace

TEST_CASE("gather_rows copies or weights the indexed rows", "[ops][moe]") {
  Tensor x = f32({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor out = empty({4, 2});
  gather_rows(out, x, i64({2, 0, 2, 1}), Tensor());
  CHECK(out.to_vector<float>() == std::vector<float>{5, 6, 1, 2, 5, 6, 3, 4});
  gather_rows(out, x, i64({2, 0, 2, 1}), f32({0.5f, 2, -1, 0}, {4}));
  CHECK(out.to_vector<float>() == std::vector<float>{2.5f, 3, 2, 4, -5, -6, 0, 0});
  // bf16 input: computed in f32 (the CPU writes f32; the caller rounds once).
  gather_rows(out, x.to(DType::bf16), i64({1, 1, 0, 2}), Tensor());
  CHECK(out.to_vector<float>() == std::vector<float>{3, 4, 3, 4, 1, 2, 5, 6});
  Tensor half = empty({4, 2}, TensorOptions(DType::bf16));
  CHECK_THROWS_WITH(gather_rows(half, x, i64({0, 0, 0, 0}), Tensor()),
                    Catch::Contains("moe gather_rows: the CPU kernel writes a contiguous f32 tensor"));
}

TEST_CASE("sum_rows sums each token's rows in row order, rounded once", "[ops][moe]") {
  Tensor y = f32({1, 10, 2, 20, 3, 30}, {3, 2});
  // Rows 0 and 2 belong to token 1, row 1 to token 0; token 2 has none.
  Tensor out = sum_rows(y, f32({1, 0.5f, 2}, {3}), i64({1, 0, 1}), 3, DType::f32);
  CHECK(out.sizes() == Shape{3, 2});
  CHECK(out.to_vector<float>() == std::vector<float>{1, 10, 7, 70, 0, 0});
  Tensor unweighted = sum_rows(y, Tensor(), i64({1, 0, 1}), 3, DType::bf16);
  CHECK(unweighted.dtype() == DType::bf16);
  CHECK(unweighted.to(DType::f32).to_vector<float>() == std::vector<float>{2, 20, 4, 40, 0, 0});
  // The same bits with one thread and with several.
  Generator gen(4);
  Tensor big = randn({300, 130}, {}, &gen);
  std::vector<std::int64_t> tok(300);
  for (std::int64_t r = 0; r < 300; ++r) tok[std::size_t(r)] = (r * 7) % 50;
  const int before = num_threads();
  set_num_threads(1);
  const auto one = sum_rows(big, Tensor(), i64(tok), 50, DType::f32).to_vector<float>();
  set_num_threads(std::max(2, before));
  const auto many = sum_rows(big, Tensor(), i64(tok), 50, DType::f32).to_vector<float>();
  set_num_threads(before);
  CHECK(one == many);
}

TEST_CASE("row_dots and moe_combine_grads", "[ops][moe]") {
  Tensor g = f32({1, 2, 3, 4}, {2, 2});   // the combine output's gradient, 2 tokens
  Tensor y = f32({1, 1, 2, 0, 0, 3}, {3, 2});  // 3 expert rows
  Tensor w = f32({0.5f, 2, 1}, {3});
  Tensor tok = i64({1, 0, 1});
  CHECK(k.run(kCPU, &MoeRowsKernels::row_dots, g, tok, y).to_vector<float>() == std::vector<float>{7, 2, 12});
  auto both = moe_combine_grads(g, y, w, tok, true, true, DType::f32, DType::f32);
  REQUIRE(both.size() == 2);
  CHECK(both[0].to_vector<float>() == std::vector<float>{1.5f, 2, 2, 4, 3, 4});
  CHECK(both[1].to_vector<float>() == std::vector<float>{7, 2, 12});
  auto only_w = moe_combine_grads(g, y, Tensor(), tok, false, true, DType::f32, DType::bf16);
  CHECK_FALSE(only_w[0].defined());
  CHECK(only_w[1].dtype() == DType::bf16);
}
