// The CUDA kernels of the reductions (sum, mean, max / amax), the norms
// (rms_norm, layer_norm), softmax / log_softmax and cross_entropy against the
// CPU kernels, forward and backward, in f32 and bf16; plus bit-identical
// results across repeated runs for every op that reduces.
//
// Tolerances: f32 rtol 1e-5, atol 1e-5. The sum / mean tests use positive
// inputs, so no sum cancels to near 0 where a relative bound means nothing.
// Parameter gradients of the norms sum hundreds of signed rows in a
// different (fixed) order than the CPU: there kF32RowSum adds atol 2e-4 (a
// few f32 ulps of the partial sums times sqrt(rows)). bf16: kBf16Tolerance
// (one bf16 rounding of an f32 result whose last bits may differ: 2^-8
// relative).
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "ops/ops.h"
#include "tests/cuda/device_compare.h"

using namespace remat;
using remat::testing::check_close;
using remat::testing::compare_on_cuda;
using remat::testing::kGpu;
using remat::testing::random_normal;
using remat::testing::DeviceFn;
using remat::testing::DeviceTolerance;
using remat::testing::kBf16Tolerance;
using remat::testing::same_bits;

namespace {

constexpr DeviceTolerance kF32{1e-5, 1e-5};
constexpr DeviceTolerance kF32RowSum{1e-5, 2e-4};

// Uniform in [0.5, 1.5): long sums of these do not cancel.
Tensor positive(const Shape& s, std::uint64_t seed, DType t = DType::f32) {
  Generator g(seed);
  return add(rand(s, {}, &g), 0.5).to(t);
}

DeviceTolerance tol_for(DType t, DeviceTolerance f32 = kF32) { return t == DType::f32 ? f32 : kBf16Tolerance; }

// Runs f forward and backward twice on CUDA from the same inputs (the same
// upstream gradient): the outputs and every input gradient must be identical
// bit for bit.
void check_repeatable(const DeviceFn& f, const std::vector<Tensor>& inputs) {
  Tensor outs[2];
  std::vector<Tensor> grads[2];
  for (int run = 0; run < 2; ++run) {
    std::vector<Tensor> dev;
    for (const auto& t : inputs) {
      if (!t.defined()) {
        dev.push_back(t);
        continue;
      }
      Tensor d = t.detach().contiguous().to(kGpu);
      if (is_floating(t.dtype())) d.set_requires_grad(true);
      dev.push_back(d);
    }
    Tensor y = f(dev);
    outs[run] = y;
    if (y.requires_grad()) {
      Generator gen(11);
      backward({y}, {randn(y.sizes(), {}, &gen).to(y.dtype()).to(kGpu)});
    }
    for (const auto& d : dev)
      if (d.defined() && d.requires_grad()) grads[run].push_back(d.grad());
  }
  CHECK(same_bits(outs[0], outs[1]));
  REQUIRE(grads[0].size() == grads[1].size());
  for (std::size_t i = 0; i < grads[0].size(); ++i) {
    INFO("gradient " << i);
    CHECK(same_bits(grads[0][i], grads[1][i]));
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// sum / mean

TEST_CASE("CUDA sum and mean match the CPU over any dims, with and without keepdim", "[cuda]") {
  for (DType t : {DType::f32, DType::bf16}) {
    INFO(dtype_name(t));
    const Tensor x = positive({3, 4, 37}, 1, t);
    const DeviceTolerance tol = tol_for(t);
    compare_on_cuda([](const std::vector<Tensor>& v) { return sum(v[0]); }, {x}, tol);
    compare_on_cuda([](const std::vector<Tensor>& v) { return mean(v[0]); }, {x}, tol);
    for (const Shape& dims : {Shape{0}, Shape{1}, Shape{2}, Shape{-1}, Shape{0, 2}, Shape{1, 2},
                              Shape{0, 1}, Shape{2, 0}, Shape{0, 1, 2}}) {
      for (bool keep : {false, true}) {
        INFO("dims " << shape_str(dims) << " keepdim " << keep);
        compare_on_cuda([&](const std::vector<Tensor>& v) { return sum(v[0], dims, keep); }, {x}, tol);
        compare_on_cuda([&](const std::vector<Tensor>& v) { return mean(v[0], dims, keep); }, {x}, tol);
      }
    }
    // A 0-dim input, and short rows (the per-thread column kernel).
    compare_on_cuda([](const std::vector<Tensor>& v) { return sum(v[0]); }, {positive({}, 2, t)}, tol);
    compare_on_cuda([](const std::vector<Tensor>& v) { return sum(v[0], {-1}); }, {positive({50, 3}, 3, t)},
                    tol);
  }
}

TEST_CASE("CUDA sums over long rows, long columns and everything", "[cuda]") {
  for (DType t : {DType::f32, DType::bf16}) {
    INFO(dtype_name(t));
    const DeviceTolerance tol = tol_for(t);
    const Tensor a = positive({64, 3001}, 4, t);
    // Long rows (a block per output), long columns (a thread per output), all (chunked rows).
    compare_on_cuda([](const std::vector<Tensor>& v) { return sum(v[0], {-1}); }, {a}, tol);
    compare_on_cuda([](const std::vector<Tensor>& v) { return mean(v[0], {0}); }, {a}, tol);
    compare_on_cuda([](const std::vector<Tensor>& v) { return sum(v[0]); }, {a}, tol);
    // Few very long rows: chunked rows.
    compare_on_cuda([](const std::vector<Tensor>& v) { return sum(v[0], {1}); },
                    {positive({5, 100003}, 5, t)}, tol);
    // Few very long columns: chunked columns.
    compare_on_cuda([](const std::vector<Tensor>& v) { return mean(v[0], {0}, true); },
                    {positive({40001, 3}, 6, t)}, tol);
    // Warp-sized rows of odd length.
    compare_on_cuda([](const std::vector<Tensor>& v) { return sum(v[0], {-1}); }, {positive({33, 999}, 7, t)},
                    tol);
  }
}

TEST_CASE("CUDA sums of non-contiguous views", "[cuda]") {
  for (DType t : {DType::f32, DType::bf16}) {
    INFO(dtype_name(t));
    const DeviceTolerance tol = tol_for(t);
    const Tensor x = positive({6, 5, 40}, 8, t);
    // Transposed: the reduced dim is the outermost in memory.
    compare_on_cuda([](const std::vector<Tensor>& v) { return sum(v[0].transpose(0, 2), {1}); }, {x}, tol);
    compare_on_cuda([](const std::vector<Tensor>& v) { return sum(v[0].transpose(0, 2), {0}); }, {x}, tol);
    // A strided slice: rows of stride 2.
    compare_on_cuda([](const std::vector<Tensor>& v) { return sum(v[0].slice(2, 0, 40, 2), {-1}); }, {x},
                    tol);
    // Reduced dims that cannot be merged (permuted): offsets per element.
    compare_on_cuda(
        [](const std::vector<Tensor>& v) { return mean(v[0].permute({1, 0, 2}), {1, 2}, true); }, {x}, tol);
    // A broadcast (stride 0) input.
    compare_on_cuda(
        [](const std::vector<Tensor>& v) { return sum(v[0].unsqueeze(1).expand({6, 30, 5, 40}), {1, 3}); },
        {x}, tol);
  }
}

TEST_CASE("CUDA sums give the same bits on every run", "[cuda]") {
  check_repeatable([](const std::vector<Tensor>& v) { return sum(v[0]); }, {random_normal({300, 1001}, 9)});
  check_repeatable([](const std::vector<Tensor>& v) { return sum(v[0], {0}); }, {random_normal({20001, 7}, 10)});
  check_repeatable([](const std::vector<Tensor>& v) { return mean(v[0], {1}); },
                   {random_normal({3, 70001}, 11, DType::bf16)});
}

// ---------------------------------------------------------------------------
// max / amax

TEST_CASE("CUDA max and amax match the CPU, values, indices and gradients", "[cuda]") {
  for (DType t : {DType::f32, DType::bf16}) {
    INFO(dtype_name(t));
    const DeviceTolerance tol = tol_for(t);
    struct Case {
      Shape shape;
      std::int64_t dim;
    };
    for (const Case& c : {Case{{7, 33}, 1}, Case{{7, 33}, 0}, Case{{3, 2000}, 1}, Case{{2000, 3}, 0},
                          Case{{4, 5, 6}, 1}, Case{{5}, 0}, Case{{2, 20000}, -1}, Case{{}, 0}}) {
      INFO("shape " << shape_str(c.shape) << " dim " << c.dim);
      const Tensor x = random_normal(c.shape, 12, t);
      for (bool keep : {false, true}) {
        compare_on_cuda([&](const std::vector<Tensor>& v) { return amax(v[0], c.dim, keep); }, {x}, tol);
        auto [vc, ic] = max(x, c.dim, keep);
        auto [vd, id] = max(x.to(kGpu), c.dim, keep);
        CHECK(same_bits(vc, vd));
        CHECK(same_bits(ic, id));
      }
    }
    // Transposed input.
    const Tensor y = random_normal({9, 40}, 13, t);
    compare_on_cuda([](const std::vector<Tensor>& v) { return amax(v[0].t(), 1); }, {y}, tol);
    compare_on_cuda([](const std::vector<Tensor>& v) { return amax(v[0].t(), 0, true); }, {y}, tol);
    // Every other element: rows of stride 2 (the row kernel's strided loads).
    compare_on_cuda([](const std::vector<Tensor>& v) { return amax(v[0].slice(1, 0, 40, 2), 1); }, {y}, tol);
  }
}

TEST_CASE("CUDA max picks the first maximum and the first NaN, like the CPU", "[cuda]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> v(3 * 40, 0.0f);
  for (int i = 0; i < 40; ++i) v[std::size_t(i)] = float(i % 7);                    // ties at 6
  for (int i = 0; i < 40; ++i) v[std::size_t(40 + i)] = -1.0f;                      // all equal
  for (int i = 0; i < 40; ++i) v[std::size_t(80 + i)] = i == 9 || i == 30 ? nan : 1.0f;  // NaNs
  for (std::int64_t len : {40, 13}) {  // the warp kernel and the per-thread scan
    const Tensor x = from_vector<float>(v, {3, 40}).narrow(1, 0, len).contiguous();
    for (DType t : {DType::f32, DType::bf16}) {
      auto [vc, ic] = max(x.to(t), 1);
      auto [vd, id] = max(x.to(t).to(kGpu), 1);
      CHECK(same_bits(ic, id));
      CHECK(id.to_vector<std::int64_t>() == std::vector<std::int64_t>{6, 0, 9});
    }
  }
  // Down a column (the reduced dim strided).
  const Tensor col = from_vector<float>(v, {3, 40}).t().contiguous();
  auto [vc, ic] = max(col, 0);
  auto [vd, id] = max(col.to(kGpu), 0);
  CHECK(same_bits(ic, id));
  CHECK(id.to_vector<std::int64_t>() == std::vector<std::int64_t>{6, 0, 9});
  // Long rows (a block per row), whole and every other element (strided loads).
  std::vector<float> w(3 * 3000, 0.0f);
  for (int i = 0; i < 3000; ++i) {
    w[std::size_t(i)] = float(i % 7);                                     // first 6 at 6 (strided: at 3)
    w[std::size_t(3000 + i)] = -1.0f;                                     // all equal
    w[std::size_t(6000 + i)] = i == 1001 || i == 2500 ? nan : 1.0f;       // strided: only 2500 (at 1250)
  }
  const Tensor xl = from_vector<float>(w, {3, 3000});
  for (DType t : {DType::f32, DType::bf16}) {
    INFO(dtype_name(t));
    auto [vl, il] = max(xl.to(t).to(kGpu), 1);
    CHECK(il.to_vector<std::int64_t>() == std::vector<std::int64_t>{6, 0, 1001});
    auto [vs, is] = max(xl.to(t).to(kGpu).slice(1, 0, 3000, 2), 1);
    CHECK(is.to_vector<std::int64_t>() == std::vector<std::int64_t>{3, 0, 1250});
  }
}

// ---------------------------------------------------------------------------
// rms_norm / layer_norm

TEST_CASE("CUDA rms_norm matches the CPU forward and backward", "[cuda]") {
  for (DType t : {DType::f32, DType::bf16}) {
    INFO(dtype_name(t));
    for (const Shape& s : {Shape{4, 7, 96}, Shape{5, 4099}, Shape{3, 33}, Shape{70, 5}, Shape{11}}) {
      INFO("shape " << shape_str(s));
      const std::int64_t d = s.back();
      const DeviceTolerance tol = tol_for(t, shape_numel(s) / d >= 64 ? kF32RowSum : kF32);
      compare_on_cuda([](const std::vector<Tensor>& v) { return rms_norm(v[0], v[1], 1e-5); },
                      {random_normal(s, 14, t), add(random_normal({d}, 15), 1.0).to(t)}, tol);
    }
    // Many rows (several parameter-gradient chunks), and a non-contiguous input.
    compare_on_cuda([](const std::vector<Tensor>& v) { return rms_norm(v[0], v[1], 1e-6); },
                    {random_normal({2000, 72}, 16, t), random_normal({72}, 17, t)}, tol_for(t, kF32RowSum));
    compare_on_cuda([](const std::vector<Tensor>& v) { return rms_norm(v[0].transpose(0, 1), v[1]); },
                    {random_normal({6, 9, 40}, 18, t), random_normal({40}, 19, t)}, tol_for(t));
  }
  check_repeatable([](const std::vector<Tensor>& v) { return rms_norm(v[0], v[1]); },
                   {random_normal({3000, 257}, 20), random_normal({257}, 21)});
  check_repeatable([](const std::vector<Tensor>& v) { return rms_norm(v[0], v[1]); },
                   {random_normal({1500, 512}, 22, DType::bf16), random_normal({512}, 23, DType::bf16)});
}

TEST_CASE("CUDA layer_norm matches the CPU with and without weight and bias", "[cuda]") {
  for (DType t : {DType::f32, DType::bf16}) {
    INFO(dtype_name(t));
    for (const Shape& s : {Shape{4, 7, 96}, Shape{5, 4099}, Shape{3, 33}, Shape{700, 13}}) {
      INFO("shape " << shape_str(s));
      const DeviceTolerance tol = tol_for(t, s[0] >= 500 ? kF32RowSum : kF32);
      const std::int64_t d = s.back();
      const Tensor x = add(random_normal(s, 24), 3.0).to(t);  // a mean far from 0
      const Tensor w = add(random_normal({d}, 25), 1.0).to(t), b = random_normal({d}, 26, t);
      auto ln = [](const std::vector<Tensor>& v) { return layer_norm(v[0], v[1], v[2], 1e-5); };
      compare_on_cuda(ln, {x, w, b}, tol);
      compare_on_cuda(ln, {x, w, Tensor()}, tol);
      compare_on_cuda(ln, {x, Tensor(), b}, tol);
      compare_on_cuda(ln, {x, Tensor(), Tensor()}, tol);
    }
    compare_on_cuda([](const std::vector<Tensor>& v) { return layer_norm(v[0].transpose(0, 1), v[1], v[2]); },
                    {random_normal({6, 9, 40}, 27, t), random_normal({40}, 28, t), random_normal({40}, 29, t)}, tol_for(t));
  }
  check_repeatable([](const std::vector<Tensor>& v) { return layer_norm(v[0], v[1], v[2]); },
                   {random_normal({3000, 257}, 30), random_normal({257}, 31), random_normal({257}, 32)});
  check_repeatable([](const std::vector<Tensor>& v) { return layer_norm(v[0], v[1], v[2]); },
                   {random_normal({1500, 512}, 33, DType::bf16), random_normal({512}, 34, DType::bf16),
                    random_normal({512}, 35, DType::bf16)});
}

TEST_CASE("CUDA layer_norm backward when only the bias needs a gradient", "[cuda]") {
  const Tensor x = random_normal({300, 50}, 36), w = random_normal({50}, 37), b = random_normal({50}, 38);
  Tensor bc = b.clone(), bd = b.to(kGpu);
  bc.set_requires_grad(true);
  bd.set_requires_grad(true);
  Tensor yc = layer_norm(x, w, bc), yd = layer_norm(x.to(kGpu), w.to(kGpu), bd);
  check_close("forward", yc, yd, kF32);
  const Tensor seed = random_normal({300, 50}, 39);
  backward({yc}, {seed});
  backward({yd}, {seed.to(kGpu)});
  check_close("bias gradient", bc.grad(), bd.grad(), kF32RowSum);
}

// ---------------------------------------------------------------------------
// softmax / log_softmax

TEST_CASE("CUDA softmax and log_softmax match the CPU forward and backward", "[cuda]") {
  for (DType t : {DType::f32, DType::bf16}) {
    INFO(dtype_name(t));
    const DeviceTolerance tol = tol_for(t);
    for (const Shape& s : {Shape{6, 37}, Shape{3, 2051}, Shape{2, 3, 1030}, Shape{40, 8}, Shape{1, 1024},
                           Shape{7}, Shape{}}) {
      INFO("shape " << shape_str(s));
      const Tensor x = mul(random_normal(s, 40), 3.0).to(t);
      compare_on_cuda([](const std::vector<Tensor>& v) { return softmax(v[0], -1); }, {x}, tol);
      compare_on_cuda([](const std::vector<Tensor>& v) { return log_softmax(v[0], -1); }, {x}, tol);
    }
    // Over a leading dim, and on a transposed view.
    const Tensor y = random_normal({37, 6}, 41, t);
    compare_on_cuda([](const std::vector<Tensor>& v) { return softmax(v[0], 0); }, {y}, tol);
    compare_on_cuda([](const std::vector<Tensor>& v) { return log_softmax(v[0].t(), -1); }, {y}, tol);
  }
  check_repeatable([](const std::vector<Tensor>& v) { return softmax(v[0], -1); }, {random_normal({64, 3001}, 42)});
  check_repeatable([](const std::vector<Tensor>& v) { return log_softmax(v[0], -1); },
                   {random_normal({300, 77}, 43, DType::bf16)});
}

// ---------------------------------------------------------------------------
// cross_entropy

TEST_CASE("CUDA cross_entropy matches the CPU, with ignored targets", "[cuda]") {
  auto ce = [](std::int64_t ignore) {
    return [ignore](const std::vector<Tensor>& v) { return cross_entropy(v[0], v[1], ignore); };
  };
  for (DType t : {DType::f32, DType::bf16}) {
    INFO(dtype_name(t));
    const DeviceTolerance tol = tol_for(t);
    // 37 classes (not a multiple of 4 or 32), two rows ignored.
    const Tensor l1 = mul(random_normal({9, 37}, 44), 2.0).to(t);
    const Tensor t1 = from_vector<std::int64_t>({0, 36, -100, 5, 17, 17, -100, 1, 30}, {9});
    compare_on_cuda(ce(-100), {l1, t1}, tol);
    compare_on_cuda(ce(-100), {l1, t1.to(DType::i32)}, tol);
    // A custom ignore_index that is also a class.
    compare_on_cuda(ce(17), {l1, from_vector<std::int64_t>({0, 36, 2, 5, 17, 17, 3, 1, 30}, {9})}, tol);
    // [2, 5, 1027] logits: a block per row with a ragged tail.
    std::vector<std::int64_t> tv;
    for (int i = 0; i < 10; ++i) tv.push_back(i == 4 ? -100 : (i * 211) % 1027);
    const Tensor l2 = random_normal({2, 5, 1027}, 45, t);
    compare_on_cuda(ce(-100), {l2, from_vector<std::int64_t>(tv, {2, 5})}, tol);
    // Every target ignored: loss 0, zero gradient.
    compare_on_cuda(ce(-100), {l1, full({9}, -100.0, DType::i64)}, tol);
    Tensor zero = cross_entropy(l1.to(kGpu), full({9}, -100.0, TensorOptions(DType::i64, kGpu)));
    CHECK(zero.item() == 0.0);
  }
  std::vector<std::int64_t> big;
  for (int i = 0; i < 512; ++i) big.push_back(i % 9 == 0 ? -100 : (i * 7919) % 5003);
  const Tensor tb = from_vector<std::int64_t>(big, {512});
  check_repeatable(ce(-100), {random_normal({512, 5003}, 46), tb});
  check_repeatable(ce(-100), {random_normal({512, 5003}, 47, DType::bf16), tb});
}

TEST_CASE("CUDA cross_entropy rejects targets out of range", "[cuda]") {
  const Tensor l = random_normal({3, 5}, 48).to(kGpu);
  CHECK_THROWS_AS(cross_entropy(l, from_vector<std::int64_t>({0, 5, 1}, {3}, kGpu)), ShapeError);
  CHECK_THROWS_AS(cross_entropy(l, from_vector<std::int64_t>({0, 1, 1}, {3})), DeviceError);
}

// ---------------------------------------------------------------------------
// Empty inputs

TEST_CASE("CUDA reductions, norms, softmax and cross_entropy of empty inputs match the CPU", "[cuda]") {
  const Tensor e30 = zeros({3, 0}), e04 = zeros({0, 4});
  // A sum over an empty dim is 0, and so is a mean over zero items (the CPU's convention).
  compare_on_cuda([](const std::vector<Tensor>& v) { return sum(v[0], {1}); }, {e30});
  compare_on_cuda([](const std::vector<Tensor>& v) { return mean(v[0], {1}, true); }, {e30});
  compare_on_cuda([](const std::vector<Tensor>& v) { return sum(v[0]); }, {e04});
  compare_on_cuda([](const std::vector<Tensor>& v) { return sum(v[0], {1}); }, {e04});
  compare_on_cuda([](const std::vector<Tensor>& v) { return amax(v[0], 1); }, {e04});
  compare_on_cuda([](const std::vector<Tensor>& v) { return softmax(v[0], -1); }, {e04});
  compare_on_cuda([](const std::vector<Tensor>& v) { return log_softmax(v[0], -1); }, {e30});
  // No rows: parameter gradients are zeros.
  compare_on_cuda([](const std::vector<Tensor>& v) { return rms_norm(v[0], v[1]); }, {e04, ones({4})});
  compare_on_cuda([](const std::vector<Tensor>& v) { return layer_norm(v[0], v[1], v[2]); },
                  {e04, ones({4}), zeros({4})});
  compare_on_cuda([](const std::vector<Tensor>& v) { return cross_entropy(v[0], v[1]); },
                  {e04, empty({0}, DType::i64)});
}
