// The CUDA kernels of the elementwise ops against the CPU kernels, forward
// and backward, in f32 and bf16: binary arithmetic (same shape, broadcasting
// either operand, transposed operands, one-element operands), scalar
// arithmetic, every unary op, casts, the in-place updates, swiglu, dropout
// and the rotary embedding. Sizes are odd (not multiples of the 4- or
// 8-element packs nor of a block) unless a case targets the packed paths.
//
// Bit-identical to the CPU (checked with `identical`): binary and scalar
// arithmetic, casts and the in-place updates (one IEEE operation, or the CPU's
// separately rounded ones, then one rounding), and dropout forward and
// backward (the same Philox words, one multiply). Within tolerance:
// everything that calls a transcendental (expf, logf, tanhf, powf differ from
// Eigen's by an ulp or two) and rotary (its cos / sin table comes from the
// device's double libm). Tolerances: f32 rtol 1e-5, atol 1e-6 (inputs kept
// where the derivatives do not cancel; atol 1e-5 where broadcast gradients
// are sums); bf16 kBf16Tolerance (one bf16 rounding of an f32 result whose
// last bits may differ: 2^-8 relative), rtol 2e-2 for rsqrt (see its case).
#include <catch2/catch.hpp>

#include <bit>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ops/ops.h"
#include "tests/cuda/device_compare.h"

using namespace remat;
using remat::testing::compare_on_cuda;
using remat::testing::kGpu;
using remat::testing::DeviceFn;
using remat::testing::DeviceTolerance;
using remat::testing::kBf16Tolerance;

namespace {

constexpr DeviceTolerance kF32{1e-5, 1e-6};
// Broadcast gradients are sums (sum_to_shape) that may come out near 0.
constexpr DeviceTolerance kF32Sums{1e-5, 1e-5};

DeviceTolerance tol_for(DType t) { return t == DType::f32 ? kF32 : kBf16Tolerance; }

// Uniform in [lo, hi), in dtype t.
Tensor uniform(const Shape& s, double lo, double hi, std::uint64_t seed, DType t = DType::f32) {
  Generator g(seed);
  return add(mul(rand(s, {}, &g), hi - lo), lo).to(t);
}

// Standard normal times `scale`, in dtype t.
Tensor normal(const Shape& s, std::uint64_t seed, DType t = DType::f32, double scale = 1.0) {
  Generator g(seed);
  return mul(randn(s, {}, &g), scale).to(t);
}

// Same sizes, dtype and every element's bits (through f32, exact for 16-bit
// dtypes; -0 and +0 differ).
bool identical(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  const auto x = a.to(kCPU).to(DType::f32).contiguous().to_vector<float>();
  const auto y = b.to(kCPU).to(DType::f32).contiguous().to_vector<float>();
  for (std::size_t i = 0; i < x.size(); ++i)
    if (std::bit_cast<std::uint32_t>(x[i]) != std::bit_cast<std::uint32_t>(y[i])) return false;
  return true;
}

// f's forward output from the CPU inputs and from copies on CUDA: same bits.
void check_forward_bits(const std::string& what, const DeviceFn& f,
                        const std::vector<Tensor>& inputs) {
  INFO(what);
  NoGradGuard ng;
  std::vector<Tensor> dev;
  for (const auto& t : inputs) dev.push_back(t.to(kGpu));
  const Tensor yc = f(inputs), yd = f(dev);
  CHECK(yd.device() == kGpu);
  CHECK(identical(yc, yd));
}

using TensorPairFn = std::function<Tensor(const Tensor&, const Tensor&)>;

struct NamedBinary {
  const char* name;
  TensorPairFn fn;
};

const std::vector<NamedBinary>& binary_ops() {
  static const std::vector<NamedBinary> ops{
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }},
  };
  return ops;
}

// Divisors stay away from zero: magnitudes in [0.5, 2), about a third negative.
Tensor divisor(const Shape& s, std::uint64_t seed, DType t) {
  auto m = uniform(s, 0.5, 2.0, seed).to_vector<float>();
  for (std::size_t i = 0; i < m.size(); ++i)
    if ((i * 7 + seed) % 3 == 0) m[i] = -m[i];
  return from_vector<float>(m, {std::int64_t(m.size())}).view(s).to(t);
}

}  // namespace

TEST_CASE("CUDA binary ops match the CPU: same shapes, broadcasting, transposed operands",
          "[cuda][elementwise]") {
  struct Case {
    const char* name;
    Shape a, b;
    bool transpose_a = false, transpose_b = false;  // operand given as its .t() (2-D)
  };
  const std::vector<Case> cases{
      {"same shape, odd size", {37, 53}, {37, 53}},
      {"same shape, whole packs", {64, 40}, {64, 40}},
      {"b broadcast along rows (bias)", {9, 16}, {16}},
      {"a broadcast along rows", {16}, {9, 16}},
      {"b broadcast along an odd inner dim", {9, 13}, {13}},
      {"b a column", {9, 16}, {9, 1}},
      {"both broadcast: [5,1,7] and [3,1]", {5, 1, 7}, {3, 1}},
      {"both broadcast: [3,1] and [5,3,7]", {3, 1}, {5, 3, 7}},
      {"b one element", {11, 7}, {1}},
      {"b 0-dim", {11, 7}, {}},
      {"a transposed", {24, 17}, {17, 24}, true, false},
      {"b transposed", {17, 24}, {24, 17}, false, true},
      {"both transposed", {24, 17}, {24, 17}, true, true},
      {"a transposed, b broadcast", {24, 17}, {24}, true, false},
  };
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const auto& op : binary_ops()) {
      for (std::size_t c = 0; c < cases.size(); ++c) {
        const Case& k = cases[c];
        INFO(op.name << " " << k.name << " " << dtype_name(dt));
        const std::uint64_t seed = 100 + c;
        Tensor a = normal(k.a, seed, dt);
        Tensor b = std::string(op.name) == "div" ? divisor(k.b, seed + 50, dt)
                                                 : normal(k.b, seed + 50, dt);
        const bool ta = k.transpose_a, tb = k.transpose_b;
        const TensorPairFn fn = op.fn;
        const DeviceFn f = [fn, ta, tb](const std::vector<Tensor>& in) {
          return fn(ta ? in[0].t() : in[0], tb ? in[1].t() : in[1]);
        };
        check_forward_bits("forward bits", f, {a, b});
        compare_on_cuda(f, {a, b}, dt == DType::f32 ? kF32Sums : kBf16Tolerance);
      }
    }
  }
}

TEST_CASE("CUDA binary ops: f16, large tensors and empty tensors", "[cuda][elementwise]") {
  for (const auto& op : binary_ops()) {
    INFO(op.name);
    const TensorPairFn fn = op.fn;
    const DeviceFn f = [fn](const std::vector<Tensor>& in) { return fn(in[0], in[1]); };
    const bool is_div = std::string(op.name) == "div";
    // f16: the CPU's rounding too.
    check_forward_bits("f16", f,
                       {normal({13, 29}, 1, DType::f16),
                        is_div ? divisor({29}, 2, DType::f16) : normal({29}, 2, DType::f16)});
    // Over a million elements (many blocks), an odd count.
    check_forward_bits("large", f,
                       {normal({1001, 1003}, 3, DType::bf16),
                        is_div ? divisor({1001, 1003}, 4, DType::bf16)
                               : normal({1001, 1003}, 4, DType::bf16)});
    // Misaligned views (offset by one element): no packs.
    const DeviceFn g = [fn](const std::vector<Tensor>& in) {
      return fn(in[0].narrow(0, 1, 40), in[1].narrow(0, 1, 40));
    };
    check_forward_bits("misaligned", g,
                       {normal({41}, 5), is_div ? divisor({41}, 6, DType::f32) : normal({41}, 6)});
    // Empty.
    NoGradGuard ng;
    Tensor e = fn(zeros({0, 5}).to(kGpu), zeros({5}).to(kGpu));
    CHECK(e.sizes() == Shape{0, 5});
  }
}

TEST_CASE("CUDA scalar arithmetic matches the CPU bit for bit", "[cuda][elementwise]") {
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> ops{
      {"add 0.3", [](const Tensor& x) { return add(x, 0.3); }},
      {"sub 1.25", [](const Tensor& x) { return sub(x, 1.25); }},
      {"mul 1.7", [](const Tensor& x) { return mul(x, 1.7); }},
      {"div 3", [](const Tensor& x) { return div(x, 3.0); }},
      {"rsub 2.5", [](const Tensor& x) { return rsub(x, 2.5); }},
      {"2 - x", [](const Tensor& x) { return 2.0 - x; }},
      {"0.1 * x", [](const Tensor& x) { return 0.1 * x; }},
  };
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const auto& [name, fn] : ops) {
      INFO(name << " " << dtype_name(dt));
      const auto op = fn;
      const DeviceFn f = [op](const std::vector<Tensor>& in) { return op(in[0]); };
      const DeviceFn ft = [op](const std::vector<Tensor>& in) { return op(in[0].t()); };
      const Tensor x = normal({33, 47}, 7, dt);
      check_forward_bits("contiguous", f, {x});
      check_forward_bits("transposed", ft, {x});
      compare_on_cuda(f, {x}, tol_for(dt));
      compare_on_cuda(ft, {x}, tol_for(dt));
    }
  }
}

TEST_CASE("CUDA unary ops match the CPU forward and backward", "[cuda][elementwise]") {
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> fn;
    double lo, hi;  // inputs uniform in [lo, hi); lo == hi: standard normal
    // bf16: the backward reads the saved bf16 output, which may differ from
    // the CPU's by one ulp (2^-8) where expf / tanhf / rsqrt round the other
    // way; rsqrt's gradient takes it cubed (3 ulps).
    double bf16_rtol = kBf16Tolerance.rtol;
  };
  const std::vector<Case> cases{
      {"neg", [](const Tensor& x) { return neg(x); }, 0, 0},
      {"exp", [](const Tensor& x) { return exp(x); }, 0, 0},
      {"log", [](const Tensor& x) { return log(x); }, 0.1, 3.0},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, 0.1, 3.0},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, 0.5, 3.0, 2e-2},
      {"pow 2.5", [](const Tensor& x) { return pow(x, 2.5); }, 0.1, 3.0},
      {"pow 3 (negative bases)", [](const Tensor& x) { return pow(x, 3.0); }, 0, 0},
      {"pow -0.5", [](const Tensor& x) { return pow(x, -0.5); }, 0.1, 3.0},
      {"abs", [](const Tensor& x) { return abs(x); }, 0, 0},
      {"relu", [](const Tensor& x) { return relu(x); }, 0, 0},
      {"gelu", [](const Tensor& x) { return gelu(x); }, -3.0, 3.0},
      {"silu", [](const Tensor& x) { return silu(x); }, -3.0, 3.0},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, -3.0, 3.0},
      {"tanh", [](const Tensor& x) { return tanh(x); }, -1.0, 1.0},
      {"-x (operator)", [](const Tensor& x) { return -x; }, 0, 0},
  };
  for (DType dt : {DType::f32, DType::bf16}) {
    for (std::size_t c = 0; c < cases.size(); ++c) {
      const Case& k = cases[c];
      INFO(k.name << " " << dtype_name(dt));
      const auto op = k.fn;
      auto input = [&](const Shape& s) {
        return k.lo == k.hi ? normal(s, 300 + c, dt) : uniform(s, k.lo, k.hi, 300 + c, dt);
      };
      const DeviceFn f = [op](const std::vector<Tensor>& in) { return op(in[0]); };
      const DeviceFn ft = [op](const std::vector<Tensor>& in) { return op(in[0].t()); };
      const DeviceTolerance tol =
          dt == DType::f32 ? kF32 : DeviceTolerance{k.bf16_rtol, kBf16Tolerance.atol};
      compare_on_cuda(f, {input({33, 47})}, tol);   // dense, odd size
      compare_on_cuda(f, {input({16, 24})}, tol);   // whole packs
      compare_on_cuda(ft, {input({47, 33})}, tol);  // strided input
    }
  }
}

TEST_CASE("CUDA cast matches the CPU bit for bit", "[cuda][elementwise]") {
  // Through Tensor::to on the device: round to nearest even, the CPU's rounding.
  const std::vector<std::pair<DType, DType>> pairs{{DType::f32, DType::bf16},
                                                   {DType::f32, DType::f16},
                                                   {DType::bf16, DType::f32},
                                                   {DType::bf16, DType::f16}};
  for (const auto& [from, to] : pairs) {
    INFO(dtype_name(from) << " -> " << dtype_name(to));
    const DType target = to;
    const DeviceFn f = [target](const std::vector<Tensor>& in) { return cast(in[0], target); };
    const DeviceFn ft = [target](const std::vector<Tensor>& in) {
      return cast(in[0].t(), target);
    };
    const Tensor x = normal({37, 53}, 51, from, 3.0);
    check_forward_bits("contiguous", f, {x});
    check_forward_bits("transposed", ft, {x});
    compare_on_cuda(f, {x}, kBf16Tolerance);
  }
}

TEST_CASE("CUDA in-place updates match the CPU bit for bit", "[cuda][elementwise]") {
  NoGradGuard ng;
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dt));
    // Runs the same update on a CPU tensor and its CUDA copy; compares.
    auto check = [&](const char* what, const Tensor& x0, const std::function<void(Tensor&)>& up) {
      INFO(what);
      Tensor xc = x0.clone(), xd = x0.to(kGpu);
      up(xc);
      up(xd);
      CHECK(xd.device() == kGpu);
      CHECK(identical(xc, xd));
    };
    const Tensor x = normal({19, 24}, 11, dt);
    const Tensor y = normal({19, 24}, 12, dt);
    const Tensor row = normal({24}, 13, dt), col = normal({19, 1}, 14, dt);
    auto on = [](const Tensor& t, const Tensor& like) { return t.to(like.device()); };
    check("add_ alpha 0.5", x, [&](Tensor& t) { add_(t, on(y, t), 0.5); });
    check("add_ broadcast row", x, [&](Tensor& t) { add_(t, on(row, t)); });
    check("mul_ scalar", x, [&](Tensor& t) { mul_(t, 1.5); });
    check("mul_ broadcast column", x, [&](Tensor& t) { mul_(t, on(col, t)); });
    check("add_ itself", x, [&](Tensor& t) { add_(t, t, -0.25); });
    // Through a transposed view of the destination.
    const Tensor x2 = normal({24, 19}, 15, dt);
    check("add_ into a transposed view", x2, [&](Tensor& t) {
      Tensor v = t.t();
      add_(v, on(row, t), 2.0);
    });
    check("mul_ scalar into a transposed view", x2, [&](Tensor& t) {
      Tensor v = t.t();
      mul_(v, -0.75);
    });
    // An operand overlapping the destination in another layout (copied first).
    const Tensor sq = normal({17, 17}, 16, dt);
    check("add_ its own transpose", sq, [&](Tensor& t) { add_(t, t.t()); });
    check("mul_ its own transpose", sq, [&](Tensor& t) { mul_(t, t.t()); });
    // Odd size, dense.
    const Tensor odd = normal({1001}, 17, dt);
    const Tensor odd_y = normal({1001}, 18, dt);
    check("add_ odd size", odd, [&](Tensor& t) { add_(t, on(odd_y, t), 3.0); });
    // zero_ and copy_ (through Tensor's CUDA copy and fill).
    check("zero_ a view", x2, [&](Tensor& t) {
      Tensor v = t.narrow(1, 3, 7);
      zero_(v);
    });
    check("copy_ broadcast into a view", x2, [&](Tensor& t) {
      Tensor v = t.t();
      copy_(v, on(row, t));
    });
  }
}

TEST_CASE("CUDA swiglu matches the CPU forward and backward", "[cuda][elementwise]") {
  const DeviceFn f = [](const std::vector<Tensor>& in) { return swiglu(in[0], in[1]); };
  // gate and up as the two halves of one [rows, 2 ffn] tensor (strided views).
  const DeviceFn halves = [](const std::vector<Tensor>& in) {
    const std::int64_t h = in[0].size(1) / 2;
    return swiglu(in[0].narrow(1, 0, h), in[0].narrow(1, h, h));
  };
  // Only one of the two gradients wanted.
  const DeviceFn only_up = [](const std::vector<Tensor>& in) {
    return swiglu(in[0].detach(), in[1]);
  };
  const DeviceFn only_gate = [](const std::vector<Tensor>& in) {
    return swiglu(in[0], in[1].detach());
  };
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dt));
    const auto tol = tol_for(dt);
    compare_on_cuda(f, {normal({37, 53}, 21, dt, 2.0), normal({37, 53}, 22, dt)}, tol);
    compare_on_cuda(f, {normal({8, 64}, 23, dt, 2.0), normal({8, 64}, 24, dt)}, tol);
    compare_on_cuda(halves, {normal({37, 106}, 25, dt, 2.0)}, tol);
    compare_on_cuda(only_up, {normal({13, 29}, 26, dt, 2.0), normal({13, 29}, 27, dt)}, tol);
    compare_on_cuda(only_gate, {normal({13, 29}, 28, dt, 2.0), normal({13, 29}, 29, dt)}, tol);
  }
}

TEST_CASE("CUDA dropout draws the CPU's mask bit for bit, forward and backward",
          "[cuda][elementwise]") {
  struct Case {
    const char* name;
    Shape shape;
    bool transpose;
  };
  const std::vector<Case> cases{
      {"odd size", {37, 53}, false},        // n % 4 == 1: a partial last block
      {"whole blocks", {8, 16}, false},     // vector loads and stores
      {"transposed input", {37, 53}, true},  // strided reads
  };
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const auto& k : cases) {
      for (double p : {0.1, 0.5}) {
        INFO(k.name << " " << dtype_name(dt) << " p " << p);
        const Tensor x0 = uniform(k.shape, 0.5, 2.0, 31, dt);  // no zeros
        const RngState start{1234, 17};                         // an odd block offset
        Generator gc(0), gd(0);
        gc.set_state(start);
        gd.set_state(start);
        Tensor xc = x0.clone(), xd = x0.to(kGpu);
        xc.set_requires_grad(true);
        xd.set_requires_grad(true);
        const bool tr = k.transpose;
        Tensor yc = dropout(tr ? xc.t() : xc, p, true, &gc);
        Tensor yd = dropout(tr ? xd.t() : xd, p, true, &gd);
        CHECK(gc.state() == gd.state());
        CHECK(yd.device() == kGpu);
        CHECK(identical(yc, yd));
        // Backward regenerates the mask from the same words.
        Tensor seed = normal(yc.sizes(), 32, dt);
        backward({yc}, {seed});
        backward({yd}, {seed.to(kGpu)});
        CHECK(identical(xc.grad(), xd.grad()));
        // Replaying the generator state replays the mask on CUDA.
        NoGradGuard ng;
        gd.set_state(start);
        CHECK(identical(dropout(tr ? xd.t() : xd, p, true, &gd), yd));
        // The mask itself: ones in, {0, 1/(1-p)} out, the CPU's elements kept.
        gc.set_state(start);
        gd.set_state(start);
        const Tensor ones_c = ones(k.shape, dt);
        CHECK(identical(dropout(ones_c, p, true, &gc), dropout(ones_c.to(kGpu), p, true, &gd)));
      }
    }
  }
}

TEST_CASE("CUDA rotary embedding matches the CPU forward and backward", "[cuda][elementwise]") {
  struct Case {
    const char* name;
    Shape shape;
    double theta;
    std::int64_t offset;
    int layout;  // 0: as is; 1: input given as x.transpose(1, 2); 2: as x.transpose(-1, -2)
  };
  const std::vector<Case> cases{
      {"odd half (5), one pair per thread", {2, 3, 7, 10}, 10000.0, 0, 0},
      {"half 8, packed", {2, 5, 16}, 500.0, 11, 0},
      {"head dim 128", {1, 2, 9, 128}, 10000.0, 3, 0},
      {"[B, S, H, D] transposed to [B, H, S, D]", {2, 7, 3, 16}, 10000.0, 0, 1},
      {"inner dim strided", {2, 16, 7}, 10000.0, 5, 2},
      {"large positions", {1, 7, 32}, 10000.0, 4090, 0},
  };
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const auto& k : cases) {
      INFO(k.name << " " << dtype_name(dt));
      const double theta = k.theta;
      const std::int64_t offset = k.offset;
      const int layout = k.layout;
      const DeviceFn f = [=](const std::vector<Tensor>& in) {
        const Tensor x = layout == 1   ? in[0].transpose(1, 2)
                         : layout == 2 ? in[0].transpose(-1, -2)
                                       : in[0];
        return rotary_embedding(x, theta, offset);
      };
      compare_on_cuda(f, {normal(k.shape, 41, dt)}, tol_for(dt));
    }
  }
}
