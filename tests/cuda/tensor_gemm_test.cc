// The engine's own CUDA paths (copies and casts between any layouts, fills,
// gradient accumulation, the sums that undo broadcasting) and the cuBLASLt
// matmul, each against the CPU.
#include <catch2/catch.hpp>
#include <cmath>

#include "cuda/config.h"
#include "cuda/gemm.h"
#include "engine/device_runtime.h"
#include "ops/ops.h"
#include "tests/cuda/device_compare.h"

using namespace remat;
using remat::testing::check_close;
using remat::testing::compare_on_cuda;
using remat::testing::kGpu;
using remat::testing::random_normal;
using remat::testing::same_bits;

TEST_CASE("CUDA copies convert between every dtype and layout", "[cuda]") {
  Tensor x = random_normal({5, 7, 3}, 1);
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64, DType::boolean}) {
    INFO(dtype_name(t));
    Tensor want = x.to(t);
    CHECK(same_bits(x.to(kGpu).to(t).to(kCPU), want));
    CHECK(same_bits(x.to(t).to(kGpu), want));
  }
  // Non-contiguous sources and destinations, both directions.
  Tensor xt = x.transpose(0, 2);
  CHECK(same_bits(xt.to(kGpu).contiguous(), xt.contiguous()));
  CHECK(same_bits(x.to(kGpu).transpose(0, 2).to(kCPU), xt.contiguous()));
  Tensor d = zeros({7, 5}, kGpu);
  d.t().copy_(x.select(2, 1).to(kGpu));
  CHECK(same_bits(d.t(), x.select(2, 1).contiguous()));
  Tensor e = x.narrow(1, 2, 3).to(kGpu);  // a narrowed host view
  CHECK(same_bits(e, x.narrow(1, 2, 3).contiguous()));
  // Broadcast copy (expand) and a large copy through the pinned staging buffers.
  Tensor row = random_normal({1, 9}, 2).to(kGpu);
  CHECK(same_bits(row.expand({4, 9}).contiguous(), random_normal({1, 9}, 2).expand({4, 9}).contiguous()));
  Tensor big = random_normal({3 << 20}, 3);
  CHECK(same_bits(big.to(kGpu), big));
}

TEST_CASE("CUDA fills write every element of any view", "[cuda]") {
  Tensor a = zeros({4, 6}, TensorOptions(DType::bf16, kGpu));
  a.fill_(2.5);
  CHECK(same_bits(a, full({4, 6}, 2.5, DType::bf16)));
  Tensor b = zeros({4, 6}, kGpu);
  b.t().narrow(0, 1, 2).fill_(-1.0);
  Tensor want = zeros({4, 6});
  want.t().narrow(0, 1, 2).fill_(-1.0);
  CHECK(same_bits(b, want));
}

TEST_CASE("CUDA gradient accumulation and broadcast sums match the CPU bit for bit", "[cuda]") {
  // x [3, 1, 5] broadcast against y [4, 5]: both gradients are sums.
  compare_on_cuda([](const std::vector<Tensor>& v) { return add(v[0], v[1]); },
                  {random_normal({3, 1, 5}, 4), random_normal({4, 5}, 5)}, {0, 0});
  // Used twice: its gradient accumulates.
  compare_on_cuda([](const std::vector<Tensor>& v) { return add(mul(v[0], v[0]), v[0]); },
                  {random_normal({33, 17}, 6)});
  // A long reduction to a scalar takes the chunked path: deterministic, and
  // within the worst-case error of an f32 tree sum of depth log2(n) = 18,
  // 18 u sum |x| (Higham, Accuracy and Stability of Numerical Algorithms,
  // 2nd ed., §4.2), of the float64 sum; so is the CPU's. (The two orders
  // differ, so their bits do: 2.3e-3 apart on a sum of 13.9 over 2^18 terms.)
  Tensor h = random_normal({1 << 18}, 7), g = h.to(kGpu);
  Tensor s1 = detail::sum_to_shape(g, {1}), s2 = detail::sum_to_shape(g, {1});
  CHECK(same_bits(s1, s2));
  double exact = 0, l1 = 0;
  for (float v : h.to_vector<float>()) {
    exact += double(v);
    l1 += std::abs(double(v));
  }
  const double bound = 18 * 0x1p-24 * l1;
  INFO("float64 sum " << exact << ", bound " << bound);
  CHECK(std::abs(double(s1.to(kCPU).item()) - exact) <= bound);
  CHECK(std::abs(double(detail::sum_to_shape(h, {1}).item()) - exact) <= bound);
}

TEST_CASE("cuBLASLt matmul matches the CPU in f32 and bf16", "[cuda]") {
  for (auto [m, k, n] : {std::array<std::int64_t, 3>{1, 1, 1}, {7, 13, 5}, {64, 96, 80}, {129, 257, 65}}) {
    INFO("m=" << m << " k=" << k << " n=" << n);
    compare_on_cuda([](const std::vector<Tensor>& v) { return matmul(v[0], v[1]); },
                    {random_normal({m, k}, 8), random_normal({k, n}, 9)}, {2e-5, 2e-5});
    compare_on_cuda([](const std::vector<Tensor>& v) { return matmul(v[0], v[1]); },
                    {random_normal({m, k}, 8, DType::bf16), random_normal({k, n}, 9, DType::bf16)},
                    remat::testing::kBf16Tolerance);
  }
  // Transposed operands (views), folded leading dims, batches, linear with bias.
  compare_on_cuda([](const std::vector<Tensor>& v) { return matmul(v[0].t(), v[1].t()); },
                  {random_normal({24, 10}, 10), random_normal({6, 24}, 11)}, {2e-5, 2e-5});
  compare_on_cuda([](const std::vector<Tensor>& v) { return matmul(v[0], v[1]); },
                  {random_normal({2, 3, 8, 16}, 12), random_normal({16, 4}, 13)}, {2e-5, 2e-5});
  compare_on_cuda([](const std::vector<Tensor>& v) { return bmm(v[0], v[1]); },
                  {random_normal({5, 8, 16}, 14), random_normal({5, 16, 3}, 15)}, {2e-5, 2e-5});
  compare_on_cuda([](const std::vector<Tensor>& v) { return linear(v[0], v[1], v[2]); },
                  {random_normal({9, 32}, 16), random_normal({24, 32}, 17), random_normal({24}, 18)}, {2e-5, 2e-5});
}

TEST_CASE("cuBLASLt picks an algorithm once per shape and repeats its bits", "[cuda]") {
  // Reads cuda/gemm.h's cache directly: compiled out in a build without CUDA
  // (which skips every [cuda] case anyway), like ops' CUDA branches.
  if constexpr (cuda::kHaveCuda) {
    Tensor a = random_normal({256, 512}, 19, DType::bf16).to(kGpu), b = random_normal({512, 384}, 20, DType::bf16).to(kGpu);
    Tensor c1 = matmul(a, b);
    const std::size_t cached = cuda::gemm_cached_algorithms();
    Tensor c2 = matmul(a, b);
    CHECK(cuda::gemm_cached_algorithms() == cached);
    CHECK(same_bits(c1, c2));
  }
}

TEST_CASE("work on a side stream is ordered by events", "[cuda]") {
  Stream side;
  Event ready;
  Tensor x = random_normal({1 << 16}, 21).to(kGpu);
  ready.record(current_stream());
  ready.wait(side.id());
  Tensor y;
  {
    StreamGuard guard(side.id());
    y = mul(x, 2.0);
  }
  side.synchronize();
  CHECK(same_bits(y, mul(random_normal({1 << 16}, 21), 2.0)));
}
