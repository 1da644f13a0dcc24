// The fused CUDA attention (cuda/attention.h through scaled_dot_product_attention)
// against the CPU op, forward and the gradients of q, k and v: causal and not,
// sequence lengths that are not multiples of the tiles (1, 17, 100, 257, 1000),
// head dims 16 / 64 / 128 and padded ones (8, 44, 72), several heads; f32,
// bf16 and f16; repeat runs give the same bits; the allocator's peak does not
// grow like S^2.
//
// Tolerances (|cuda - cpu| <= atol + rtol |cpu| per element):
//  - f32: rtol 1e-5, atol 1e-5. Both sides compute in f32 with different
//    summation orders (and expf vs std::exp); gradients of attention cancel
//    (dS = P (dP - delta)), so elements near 0 need the absolute bound.
//  - bf16 / f16: rtol 2e-2, atol 2e-2 (twice kBf16Tolerance). Like other
//    flash-attention kernels, the tensor-core path rounds P and dS to the
//    input dtype before the P V, P^T dO, dS^T Q and dS K products (2^-9
//    relative per term in bf16) and rounds every result once, while the CPU
//    keeps P and dS in f32. A sum of many such terms that cancels (dV and dK
//    of early keys under a causal mask) lands up to ~0.7 of kBf16Tolerance
//    away from the f32 result in a CPU emulation of the kernels; the factor
//    two is headroom for other seeds.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "engine/device_runtime.h"
#include "engine/allocator.h"
#include "ops/attention.h"
#include "ops/ops.h"
#include "tests/cuda/device_compare.h"

using namespace remat;
using remat::testing::check_close;
using remat::testing::compare_on_cuda;
using remat::testing::kGpu;
using remat::testing::random_normal;
using remat::testing::DeviceFn;
using remat::testing::DeviceTolerance;
using remat::testing::same_bits;

namespace {

constexpr DeviceTolerance kF32{1e-5, 1e-5};
constexpr DeviceTolerance k16Bit{2e-2, 2e-2};

std::vector<Tensor> qkv(const Shape& s, std::uint64_t seed, DType t) {
  return {random_normal(s, seed, t), random_normal(s, seed + 1, t), random_normal(s, seed + 2, t)};
}

DeviceFn attention(bool causal, double scale = 0) {
  return [=](const std::vector<Tensor>& x) {
    return scaled_dot_product_attention(x[0], x[1], x[2], causal, scale);
  };
}

DeviceTolerance tol_for(DType t) { return t == DType::f32 ? kF32 : k16Bit; }

struct Result {
  Tensor out, dq, dk, dv;
};

// Output and gradients on CUDA for upstream gradient `seed`; `want` says which
// of q, k, v require grad (the others' gradients stay undefined).
Result run_cuda(const std::vector<Tensor>& in, const Tensor& seed, bool causal,
                std::vector<bool> want = {true, true, true}) {
  std::vector<Tensor> x, wrt;
  for (std::size_t i = 0; i < 3; ++i) {
    Tensor t = in[i].to(kGpu).detach();
    if (want[i]) {
      t.set_requires_grad(true);
      wrt.push_back(t);
    }
    x.push_back(t);
  }
  Tensor out = scaled_dot_product_attention(x[0], x[1], x[2], causal);
  const std::vector<Tensor> g = grad({out}, wrt, {seed.to(kGpu)});
  Result r{out.detach(), {}, {}, {}};
  std::size_t n = 0;
  Tensor* slots[3] = {&r.dq, &r.dk, &r.dv};
  for (std::size_t i = 0; i < 3; ++i)
    if (want[i]) *slots[i] = g[n++];
  return r;
}

// Bytes above `base` at the allocator's peak since `reset_peak`.
std::int64_t peak_above(CachingAllocator& a, std::int64_t base) {
  return a.stats().allocated_peak - base;
}

}  // namespace

TEST_CASE("CUDA attention matches the CPU in f32: ragged S, head dims, causal or not",
          "[cuda][attention]") {
  for (bool causal : {true, false}) {
    for (std::int64_t s : {1, 17, 100, 257}) {
      for (std::int64_t d : {16, 64, 128}) {
        INFO("f32 causal " << causal << " S " << s << " D " << d);
        compare_on_cuda(attention(causal), qkv({2, 3, s, d}, std::uint64_t(s * 1000 + d), DType::f32),
                        kF32);
      }
    }
    // Head dims padded inside the kernel (to 16, 64, 128), and an explicit scale.
    for (std::int64_t d : {8, 44, 72}) {
      INFO("f32 causal " << causal << " padded D " << d);
      compare_on_cuda(attention(causal), qkv({1, 2, 70, d}, std::uint64_t(d), DType::f32), kF32);
    }
    INFO("f32 causal " << causal << " scale 0.3");
    compare_on_cuda(attention(causal, 0.3), qkv({2, 2, 45, 32}, 7, DType::f32), kF32);
  }
}

TEST_CASE("CUDA attention matches the CPU in bf16 and f16 (tensor cores)", "[cuda][attention]") {
  for (bool causal : {true, false}) {
    for (std::int64_t s : {1, 17, 100, 257}) {
      for (std::int64_t d : {16, 64, 128}) {
        INFO("bf16 causal " << causal << " S " << s << " D " << d);
        compare_on_cuda(attention(causal), qkv({2, 3, s, d}, std::uint64_t(s * 1000 + d), DType::bf16),
                        k16Bit);
      }
    }
    for (std::int64_t d : {8, 44, 72}) {
      INFO("bf16 causal " << causal << " padded D " << d);
      compare_on_cuda(attention(causal), qkv({1, 2, 70, d}, std::uint64_t(d), DType::bf16),
                      k16Bit);
    }
    for (std::int64_t d : {32, 64}) {
      INFO("f16 causal " << causal << " D " << d);
      compare_on_cuda(attention(causal), qkv({2, 2, 100, d}, std::uint64_t(d + 5), DType::f16),
                      k16Bit);
    }
  }
  // Many tiles in each direction.
  INFO("bf16 S 1000 D 128");
  compare_on_cuda(attention(true), qkv({1, 2, 1000, 128}, 99, DType::bf16), k16Bit);
}

TEST_CASE("CUDA attention of non-contiguous views ([B, S, H, D] transposed)", "[cuda][attention]") {
  for (DType t : {DType::f32, DType::bf16}) {
    INFO(dtype_name(t));
    const std::vector<Tensor> x = qkv({2, 37, 3, 64}, 11, t);
    compare_on_cuda(
        [](const std::vector<Tensor>& v) {
          return scaled_dot_product_attention(v[0].transpose(1, 2), v[1].transpose(1, 2),
                                              v[2].transpose(1, 2), true);
        },
        x, tol_for(t));
  }
}

TEST_CASE("CUDA attention with grouped key/value heads (one, and two for six query heads)", "[cuda][attention]") {
  // One key/value head is the case whose repeat could stay a stride-0 view.
  for (std::int64_t hkv : {1, 2}) {
    for (DType t : {DType::f32, DType::bf16}) {
      INFO(dtype_name(t) << " Hkv " << hkv);
      const std::vector<Tensor> x = {random_normal({2, 6, 33, 16}, 51, t), random_normal({2, hkv, 33, 16}, 52, t),
                                     random_normal({2, hkv, 33, 16}, 53, t)};
      compare_on_cuda(attention(true), x, tol_for(t));
    }
  }
  // The op table's case (tests/ops/op_cases.cc): head dim 4, five rows.
  compare_on_cuda(attention(true),
                  {random_normal({1, 2, 5, 4}, 54), random_normal({1, 1, 5, 4}, 55), random_normal({1, 1, 5, 4}, 56)},
                  kF32);
}

TEST_CASE("CUDA attention gives the same bits on every run, whichever inputs need grad",
          "[cuda][attention]") {
  for (DType t : {DType::f32, DType::bf16}) {
    for (bool causal : {true, false}) {
      INFO(dtype_name(t) << " causal " << causal);
      const Shape shape{2, 2, 257, 64};
      const std::vector<Tensor> x = qkv(shape, 21, t);
      const Tensor seed = random_normal(shape, 24, t);
      const Result a = run_cuda(x, seed, causal), b = run_cuda(x, seed, causal);
      CHECK(same_bits(a.out, b.out));
      CHECK(same_bits(a.dq, b.dq));
      CHECK(same_bits(a.dk, b.dk));
      CHECK(same_bits(a.dv, b.dv));
      // One gradient at a time: the same kernels, the same bits.
      CHECK(same_bits(run_cuda(x, seed, causal, {true, false, false}).dq, a.dq));
      CHECK(same_bits(run_cuda(x, seed, causal, {false, true, false}).dk, a.dk));
      CHECK(same_bits(run_cuda(x, seed, causal, {false, false, true}).dv, a.dv));
    }
  }
}

TEST_CASE("CUDA attention memory grows linearly in S, not like S^2", "[cuda][attention]") {
  CachingAllocator& alloc = allocator_for(kGpu);
  // [1, 4, S, 64] f32: each of q, k, v, out and the gradients is S KiB; an
  // S x S score matrix for the 4 heads would be 16 S^2 bytes (64 MiB at S 2048).
  std::int64_t fwd[2] = {0, 0}, bwd[2] = {0, 0};
  const std::int64_t lengths[2] = {1024, 2048};
  for (int n = 0; n < 2; ++n) {
    const std::int64_t s = lengths[n];
    const Shape shape{1, 4, s, 64};
    const std::int64_t tensor_bytes = 4 * s * 64 * 4;
    Tensor q = random_normal(shape, 31).to(kGpu).set_requires_grad(true);
    Tensor k = random_normal(shape, 32).to(kGpu).set_requires_grad(true);
    Tensor v = random_normal(shape, 33).to(kGpu).set_requires_grad(true);
    const Tensor seed = random_normal(shape, 34).to(kGpu);
    synchronize(cuda_device(0));

    std::int64_t base = alloc.stats().allocated_bytes;
    alloc.reset_peak();
    Tensor out = scaled_dot_product_attention(q, k, v, true);
    // Beyond the output: the [1, 4, S] log-sum-exp (and allocator rounding).
    fwd[n] = peak_above(alloc, base) - tensor_bytes;

    base = alloc.stats().allocated_bytes;
    alloc.reset_peak();
    const std::vector<Tensor> g = grad({out}, {q, k, v}, {seed});
    // Beyond the three gradients: delta (and whatever autograd adds, all O(S)).
    bwd[n] = peak_above(alloc, base) - 3 * tensor_bytes;
    synchronize(cuda_device(0));
    INFO("S " << s << ": forward extra " << fwd[n] << " B, backward extra " << bwd[n] << " B");
    CHECK(fwd[n] < 4 * s * s);    // 1/4 of the score matrix
    CHECK(bwd[n] < 4 * s * s);
  }
  INFO("forward extra " << fwd[0] << " -> " << fwd[1] << ", backward extra " << bwd[0] << " -> "
                        << bwd[1]);
  // Doubling S at most doubles what comes on top (plus allocator slack).
  CHECK(fwd[1] <= 2 * fwd[0] + (2 << 20));
  CHECK(bwd[1] <= 2 * bwd[0] + (2 << 20));
}

TEST_CASE("CUDA attention rejects head dims above 128", "[cuda][attention]") {
  const std::vector<Tensor> x = qkv({1, 1, 8, 160}, 41, DType::f32);
  CHECK_THROWS_AS(scaled_dot_product_attention(x[0].to(kGpu), x[1].to(kGpu), x[2].to(kGpu)),
                  ShapeError);
}
