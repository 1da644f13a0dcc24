// The CUDA kernels for embedding, indexing, top-k and joins (cuda/embedding,
// cuda/index, cuda/topk, cuda/copy through ops/join) against the CPU ops,
// forward and backward.
//
// Tolerance: exact (0, 0) everywhere. Gathers, top-k and joins copy elements;
// every scatter-add (embedding and index backward, scatter_add, index_add)
// sums each destination's sources in the CPU's order in f32 and rounds once,
// so f32, bf16 and f16 results equal the CPU's bit for bit. Repeated
// destinations are covered on both scatter paths (at most 16 indices along
// the dim: an in-order scan; more: host-built source lists), with a repeat
// run that must give the same bits.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "engine/autograd.h"
#include "engine/tensor.h"
#include "ops/embedding.h"
#include "ops/index.h"
#include "ops/join.h"
#include "ops/ops.h"
#include "ops/topk.h"
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

constexpr DeviceTolerance kExact{0.0, 0.0};
const std::vector<DType> kFloats = {DType::f32, DType::bf16, DType::f16};

// `n` ids in [0, range) with many repeats, deterministic.
Tensor ids(std::int64_t n, std::int64_t range, std::uint64_t seed, DType t = DType::i64, Shape s = {}) {
  std::vector<std::int64_t> v;
  std::uint64_t x = seed * 2654435761u + 1;
  for (std::int64_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v.push_back(std::int64_t((x >> 33) % std::uint64_t(range)));
  }
  if (s.empty()) s = {n};
  return from_vector<std::int64_t>(v, s).to(t);
}

struct DeviceRun {
  Tensor y;
  std::vector<Tensor> grads;
};

// f on CUDA from fresh leaves (copies of `inputs`), backward with a fixed seed.
DeviceRun run_on_cuda(const DeviceFn& f, const std::vector<Tensor>& inputs) {
  std::vector<Tensor> dev;
  for (const auto& t : inputs) {
    Tensor d = t.detach().contiguous().to(kGpu);
    if (is_floating(t.dtype())) d.set_requires_grad(true);
    dev.push_back(d);
  }
  DeviceRun r;
  r.y = f(dev);
  Generator gen(5);
  backward({r.y}, {randn(r.y.sizes(), {}, &gen).to(r.y.dtype()).to(kGpu)});
  for (const auto& d : dev) r.grads.push_back(d.requires_grad() ? d.grad() : Tensor());
  return r;
}

// Two CUDA runs of f give the same output and gradient bits.
void check_repeatable(const DeviceFn& f, const std::vector<Tensor>& inputs) {
  const DeviceRun a = run_on_cuda(f, inputs), b = run_on_cuda(f, inputs);
  CHECK(same_bits(a.y, b.y));
  for (std::size_t i = 0; i < a.grads.size(); ++i)
    if (a.grads[i].defined()) {
      INFO("gradient of input " << i);
      CHECK(same_bits(a.grads[i], b.grads[i]));
    }
}

// x rounded down to multiples of 0.5: a few levels, so many equal values.
Tensor few_levels(const Tensor& x) {
  std::vector<float> v = x.to_vector<float>();
  for (float& e : v) e = std::floor(e * 2.0f) / 2.0f;
  return from_vector<float>(v, x.sizes());
}

void check_exact(const DeviceFn& f, const std::vector<Tensor>& inputs) { compare_on_cuda(f, inputs, kExact); }

}  // namespace

TEST_CASE("cuda embedding: forward rows and deterministic backward with repeated ids", "[cuda][embedding]") {
  const DeviceFn emb = [](const std::vector<Tensor>& x) { return embedding(x[0], x[1]); };
  for (DType t : kFloats)
    for (std::int64_t d : {1, 7, 64, 129}) {
      INFO(dtype_name(t) << " d " << d);
      const Tensor w = random_normal({37, d}, 1, t);
      check_exact(emb, {w, ids(15, 37, 2, DType::i64, {3, 5})});
      check_exact(emb, {w, ids(300, 3, 3, DType::i32)});  // long lists per id
      check_exact(emb, {w, ids(1, 37, 4)});
      check_repeatable(emb, {w, ids(500, 11, 5)});
    }
  // Non-contiguous ids; an empty id list.
  const Tensor w = random_normal({20, 9}, 6);
  check_exact([](const std::vector<Tensor>& x) { return embedding(x[0], x[1].t()); },
              {w, ids(12, 20, 7, DType::i64, {3, 4})});
  check_exact(emb, {w, ids(0, 20, 8)});
  // Bad ids are rejected with the CPU's message.
  const Tensor wg = zeros({10, 4}).to(kGpu);
  CHECK_THROWS_WITH(embedding(wg, from_vector<std::int64_t>({3, 12}).to(kGpu)),
                    Catch::Contains("embedding: id 12 at position 1 is out of range for a table of 10 rows"));
  CHECK_THROWS_WITH(embedding(wg, from_vector<std::int32_t>({-1}).to(kGpu)),
                    Catch::Contains("embedding: id -1 at position 0 is out of range"));
  CHECK_THROWS_AS(embedding(wg, from_vector<std::int64_t>({1})), DeviceError);  // ids on the CPU
}

TEST_CASE("cuda index_select on several dims, both backward paths", "[cuda][index]") {
  for (DType t : {DType::f32, DType::bf16}) {
    INFO(dtype_name(t));
    const Tensor x = random_normal({5, 6, 7}, 11, t);
    for (std::int64_t d = 0; d < 3; ++d) {
      INFO("dim " << d);
      const DeviceFn sel = [d](const std::vector<Tensor>& in) { return index_select(in[0], d, in[1]); };
      const std::int64_t n = x.size(d);
      check_exact(sel, {x, ids(4, n, 12 + std::uint64_t(d))});                   // scan path
      check_exact(sel, {x, ids(40, n, 13 + std::uint64_t(d), DType::i32)});     // list path
      check_repeatable(sel, {x, ids(40, n, 14 + std::uint64_t(d))});
      check_repeatable(sel, {x, ids(9, n, 15 + std::uint64_t(d))});
      check_exact(sel, {x, ids(0, n, 16)});
      check_exact(sel, {x, full({}, 1.0, DType::i64)});  // 0-D index
    }
    // Non-contiguous input (generic gather) and strided index.
    check_exact([](const std::vector<Tensor>& in) { return index_select(in[0].transpose(0, 2), 1, in[1]); },
                {x, ids(30, 6, 17)});
    check_exact([](const std::vector<Tensor>& in) { return index_select(in[0], 2, in[1].slice(0, 0, 40, 2)); },
                {x, ids(40, 7, 18)});
    check_exact([](const std::vector<Tensor>& in) { return index_select(in[0].t(), 0, in[1]); },
                {random_normal({33, 129}, 19, t), ids(200, 129, 20)});
  }
  // Any dtype is copied exactly (forward only).
  const Tensor xi = ids(24, 1000, 21, DType::i64, {4, 6});
  check_exact([](const std::vector<Tensor>& in) { return index_select(in[0], 1, in[1]); }, {xi, ids(5, 6, 22)});
  // Bad indices: the CPU's message.
  const Tensor xg = zeros({3, 4}).to(kGpu);
  CHECK_THROWS_WITH(index_select(xg, 1, from_vector<std::int64_t>({0, 4}).to(kGpu)),
                    Catch::Contains("index_select: index 4 (at position [1] of index [2] i64 cuda"));
  CHECK_THROWS_AS(index_select(xg, 0, from_vector<std::int64_t>({0})), DeviceError);  // index on the CPU
}

TEST_CASE("cuda gather along each dim, narrower index, both backward paths", "[cuda][index]") {
  for (DType t : {DType::f32, DType::bf16}) {
    INFO(dtype_name(t));
    const Tensor x = random_normal({4, 5}, 31, t);
    const Tensor gi = ids(12, 4, 32, DType::i64, {3, 4});  // narrower than x in dim 1
    check_exact([](const std::vector<Tensor>& in) { return gather(in[0], 0, in[1]); }, {x, gi});
    check_exact([](const std::vector<Tensor>& in) { return gather(in[0], 1, in[1]); }, {x, gi});
    check_exact([](const std::vector<Tensor>& in) { return gather(in[0].t(), 1, in[1]); },
                {random_normal({5, 4}, 33, t), ids(12, 5, 34, DType::i32, {4, 3})});
    check_exact([](const std::vector<Tensor>& in) { return gather(in[0], 2, in[1]); },
                {random_normal({2, 3, 4}, 35, t), ids(12, 4, 36, DType::i64, {2, 3, 2})});
    // 40 indices along the dim: the backward takes the list path.
    const DeviceFn wide = [](const std::vector<Tensor>& in) { return gather(in[0], 1, in[1]); };
    check_exact(wide, {random_normal({3, 50}, 37, t), ids(120, 50, 38, DType::i64, {3, 40})});
    check_repeatable(wide, {random_normal({3, 50}, 37, t), ids(120, 50, 38, DType::i64, {3, 40})});
    check_exact([](const std::vector<Tensor>& in) { return gather(in[0], 0, in[1].t()); },
                {random_normal({30, 3}, 39, t), ids(60, 30, 40, DType::i64, {3, 20})});  // strided index
  }
  const Tensor xg = zeros({3, 4}).to(kGpu);
  CHECK_THROWS_WITH(gather(xg, 1, from_vector<std::int64_t>({0, 7}, {1, 2}).to(kGpu)),
                    Catch::Contains("gather: index 7 (at position [0, 1] of index [1, 2] i64 cuda"));
}

TEST_CASE("cuda scatter_add and index_add: repeated destinations, exact and repeatable", "[cuda][index]") {
  for (DType t : kFloats) {
    INFO(dtype_name(t));
    const DeviceFn sa1 = [](const std::vector<Tensor>& in) { return scatter_add(in[0], 1, in[1], in[2]); };
    const DeviceFn sa0 = [](const std::vector<Tensor>& in) { return scatter_add(in[0], 0, in[1], in[2]); };
    // Scan path (k <= 16), src wider than index (its extra column gets no gradient).
    check_exact(sa1, {random_normal({4, 5}, 41, t), ids(6, 5, 42, DType::i64, {2, 3}), random_normal({2, 4}, 43, t)});
    check_exact(sa0, {random_normal({4, 5}, 44, t), ids(10, 4, 45, DType::i32, {2, 5}), random_normal({3, 5}, 46, t)});
    // List path (k > 16): many sources per destination.
    const std::vector<Tensor> big1 = {random_normal({3, 7}, 47, t), ids(150, 7, 48, DType::i64, {3, 50}),
                                      random_normal({3, 61}, 49, t)};
    check_exact(sa1, big1);
    check_repeatable(sa1, big1);
    const std::vector<Tensor> big0 = {random_normal({5, 4}, 50, t), ids(160, 5, 51, DType::i64, {40, 4}),
                                      random_normal({40, 6}, 52, t)};
    check_exact(sa0, big0);
    check_repeatable(sa0, big0);
    // 1-D bins, and a transposed src.
    check_exact(sa0, {random_normal({9}, 53, t), ids(1000, 9, 54), random_normal({1000}, 55, t)});
    check_exact([](const std::vector<Tensor>& in) { return scatter_add(in[0], 0, in[1], in[2].t()); },
                {random_normal({4, 5}, 56, t), ids(10, 4, 57, DType::i64, {2, 5}), random_normal({5, 2}, 58, t)});

    const DeviceFn ia0 = [](const std::vector<Tensor>& in) { return index_add(in[0], 0, in[1], in[2]); };
    const DeviceFn ia1 = [](const std::vector<Tensor>& in) { return index_add(in[0], 1, in[1], in[2]); };
    check_exact(ia1, {random_normal({4, 5}, 61, t), ids(3, 5, 62), random_normal({4, 3}, 63, t)});
    const std::vector<Tensor> rows = {random_normal({6, 33}, 64, t), ids(100, 6, 65, DType::i32), random_normal({100, 33}, 66, t)};
    check_exact(ia0, rows);
    check_repeatable(ia0, rows);
    const std::vector<Tensor> cols = {random_normal({3, 8, 5}, 67, t), ids(70, 8, 68), random_normal({3, 70, 5}, 69, t)};
    check_exact(ia1, cols);
    check_repeatable(ia1, cols);
    check_exact([](const std::vector<Tensor>& in) { return index_add(in[0].t(), 0, in[1], mul(in[2], in[2])); },
                {random_normal({5, 4}, 70, t), ids(20, 4, 71, DType::i32), random_normal({20, 5}, 72, t)});
  }
  const Tensor xg = zeros({3, 4}).to(kGpu);
  CHECK_THROWS_WITH(scatter_add(xg, 0, from_vector<std::int64_t>({3}, {1, 1}).to(kGpu), zeros({1, 1}).to(kGpu)),
                    Catch::Contains("scatter_add: index 3 (at position [0, 0] of index [1, 1] i64 cuda"));
  CHECK_THROWS_WITH(index_add(xg, 0, from_vector<std::int64_t>({5}, {1}).to(kGpu), zeros({1, 4}).to(kGpu)),
                    Catch::Contains("index_add: index 5 (at position [0] of index [1] i64 cuda"));
}

TEST_CASE("cuda topk: values and indices equal the CPU's, ties and NaN included", "[cuda][topk]") {
  struct Case {
    Shape shape;
    std::int64_t k, dim;
  };
  const std::vector<Case> cases = {{{33, 64}, 2, -1}, {{33, 64}, 8, -1}, {{7, 300}, 8, 1}, {{5, 40}, 40, 1},
                                   {{40, 6}, 3, 0},   {{3, 17, 4}, 5, 1}, {{1000}, 1, 0}, {{9, 1}, 1, 1},
                                   {{4, 0}, 0, 1}};
  for (DType t : kFloats)
    for (const auto& c : cases)
      for (bool largest : {true, false})
        for (bool ties : {false, true}) {
          INFO(dtype_name(t) << " " << shape_str(c.shape) << " k " << c.k << " dim " << c.dim
                             << (largest ? " largest" : " smallest") << (ties ? " ties" : ""));
          Tensor x = random_normal(c.shape, 80 + std::uint64_t(c.k), DType::f32);
          if (ties) x = few_levels(x);
          x = x.to(t);
          const DeviceFn vals = [&](const std::vector<Tensor>& in) { return topk(in[0], c.k, c.dim, largest).first; };
          check_exact(vals, {x});
          const Tensor ic = topk(x, c.k, c.dim, largest).second;
          const Tensor id = topk(x.to(kGpu), c.k, c.dim, largest).second;
          CHECK(id.device().is_cuda());
          CHECK(id.dtype() == DType::i64);
          CHECK(ic.to_vector<std::int64_t>() == id.to_vector<std::int64_t>());
        }
  // A transposed input.
  check_exact([](const std::vector<Tensor>& in) { return topk(in[0].t(), 4, -1).first; }, {random_normal({50, 9}, 90)});
  // -0.0 ties with 0.0 (lower index first); NaN ranks above every number for
  // largest and below for smallest.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor s = from_vector<float>({0.0f, -0.0f, 1.0f, nan, -0.0f, 0.0f, nan, -1.0f}, {1, 8});
  for (bool largest : {true, false}) {
    auto [vc, ic] = topk(s, 8, -1, largest);
    auto [vd, id] = topk(s.to(kGpu), 8, -1, largest);
    CHECK(ic.to_vector<std::int64_t>() == id.to_vector<std::int64_t>());
    const auto a = vc.to_vector<float>(), b = vd.to_vector<float>();
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO("position " << i);
      CHECK(std::isnan(a[i]) == std::isnan(b[i]));
      if (!std::isnan(a[i])) CHECK(std::signbit(a[i]) == std::signbit(b[i]));
    }
  }
  CHECK(topk(s.to(kGpu), 3, -1, true).second.to_vector<std::int64_t>() == std::vector<std::int64_t>{3, 6, 2});
}

TEST_CASE("cuda cat and stack on several dims, non-contiguous inputs", "[cuda][join]") {
  for (DType t : {DType::f32, DType::bf16}) {
    INFO(dtype_name(t));
    const Tensor a = random_normal({3, 4, 5}, 101, t), b = random_normal({3, 2, 5}, 102, t), c = random_normal({5, 2, 3}, 103, t);
    check_exact([](const std::vector<Tensor>& in) { return cat({in[0], in[1], in[2].transpose(0, 2)}, 1); },
                {a, b, c});
    check_exact([](const std::vector<Tensor>& in) { return cat({in[0], in[1]}, 0); },
                {random_normal({2, 7}, 104, t), random_normal({5, 7}, 105, t)});
    check_exact([](const std::vector<Tensor>& in) { return cat({in[0].t(), in[1], in[0].t()}, -1); },
                {random_normal({3, 4}, 106, t), random_normal({4, 1}, 107, t)});
    check_exact([](const std::vector<Tensor>& in) { return cat({in[0], in[1].narrow(0, 0, 0), in[0]}, 0); },
                {random_normal({3, 4}, 108, t), random_normal({2, 4}, 109, t)});  // an empty piece
    for (std::int64_t d = 0; d <= 2; ++d) {
      INFO("stack dim " << d);
      check_exact([d](const std::vector<Tensor>& in) { return stack({in[0], in[1].t(), in[0]}, d); },
                  {random_normal({3, 4}, 110, t), random_normal({4, 3}, 111, t)});
    }
  }
  // Integer tensors are copied too (forward only).
  check_exact([](const std::vector<Tensor>& in) { return cat({in[0], in[1].t()}, 1); },
              {ids(6, 100, 112, DType::i64, {2, 3}), ids(8, 100, 113, DType::i64, {4, 2})});
}
