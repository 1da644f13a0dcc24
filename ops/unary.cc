// The unary ops: one definition each over shared kernels, and the CPU kernels.
#include "ops/unary.h"

#include <Eigen/Core>
#include <cmath>

#include "ops/kernel_util.h"
#include "ops/op.h"

namespace remat {

using namespace ops_detail;

KernelTable<UnaryKernels>& unary_kernels() {
  static KernelTable<UnaryKernels> t("unary ops");
  return t;
}

namespace {

using ArrayMap = Eigen::Map<Eigen::ArrayXf>;
using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf>;

// ---------------------------------------------------------------------------
// The ops

struct UnaryState {
  UnaryFn fn;
  float param = 0.0f;  // pow's exponent
};

// Whether the backward of `f` reads the op's output (else its input).
constexpr bool saves_output(UnaryFn f) {
  return f == UnaryFn::exp || f == UnaryFn::sqrt || f == UnaryFn::rsqrt || f == UnaryFn::relu ||
         f == UnaryFn::sigmoid || f == UnaryFn::tanh;
}

// Vector FLOPs per element (a transcendental counts as one).
double flops_per_element(UnaryFn f) {
  switch (f) {
    case UnaryFn::neg: case UnaryFn::abs: case UnaryFn::relu: return 1;
    case UnaryFn::gelu: return 8;
    case UnaryFn::silu: case UnaryFn::sigmoid: return 4;
    default: return 2;
  }
}

void check(const OpDef& op, const std::vector<Tensor>& in, const UnaryState&) {
  check_floating(op.name(), in[0], "input");
}

OpResults forward(const std::vector<Tensor>& in, UnaryState& s) {
  return {{unary_kernels().run(in[0].device(), &UnaryKernels::forward, s.fn, in[0], s.param)}};
}

std::vector<Tensor> backward(const OpBackward<UnaryState>& b) {
  const UnaryState& s = b.state();
  if (s.fn == UnaryFn::neg) return {neg(b.grad())};
  const Tensor& saved = b.saved(saves_output(s.fn) ? "y" : "x");
  return {unary_kernels().run(b.grad().device(), &UnaryKernels::backward, s.fn, b.grad(), saved, s.param)};
}

OpCost cost(const std::vector<Tensor>& in, const UnaryState& s) {
  const double n = double(in[0].numel());
  return {0, flops_per_element(s.fn) * n, 2 * n * double(element_size(in[0].dtype()))};
}

// The definition of unary op `name` computing `f`.
Op<UnaryState> define(const char* name, UnaryFn f, const char* summary) {
  std::vector<SaveSpec> saves;
  if (f != UnaryFn::neg)
    saves.push_back(saves_output(f) ? SaveSpec{"y", SaveFrom::output, 0} : SaveSpec{"x", SaveFrom::input, 0});
  return Op<UnaryState>({.name = name, .inputs = {"x"}, .outputs = {{"y"}}, .saves = saves, .summary = summary},
                        {.check = check, .forward = forward, .backward = backward, .cost = cost},
                        &unary_kernels());
}

// Definitions (and so the op table's entries) made in the order the ops run
// here; the state names the function.
const Op<UnaryState> kNeg = define("neg", UnaryFn::neg, "-x");
const Op<UnaryState> kExp = define("exp", UnaryFn::exp, "e^x");
const Op<UnaryState> kLog = define("log", UnaryFn::log, "natural log");
const Op<UnaryState> kSqrt = define("sqrt", UnaryFn::sqrt, "square root");
const Op<UnaryState> kRsqrt = define("rsqrt", UnaryFn::rsqrt, "1 / sqrt(x)");
const Op<UnaryState> kPow = define("pow", UnaryFn::pow, "x ** p, scalar p");
const Op<UnaryState> kAbs = define("abs", UnaryFn::abs, "absolute value");
const Op<UnaryState> kRelu = define("relu", UnaryFn::relu, "max(x, 0)");
const Op<UnaryState> kGelu = define("gelu", UnaryFn::gelu, "GELU, tanh approximation");
const Op<UnaryState> kSilu = define("silu", UnaryFn::silu, "x * sigmoid(x)");
const Op<UnaryState> kSigmoid = define("sigmoid", UnaryFn::sigmoid, "1 / (1 + e^-x)");
const Op<UnaryState> kTanh = define("tanh", UnaryFn::tanh, "tanh");

// ---------------------------------------------------------------------------
// CPU kernels (f32)

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;

// Applies fn(in, out) (Eigen array maps over one block) to x.
template <typename Fn>
Tensor map(const Tensor& x, Fn&& fn) {
  Tensor xf = f32_contiguous(x);
  Tensor out = empty(x.sizes(), DType::f32);
  if (skip_compute(out)) return out;
  const float* px = xf.data<float>();
  float* po = out.data<float>();
  parallel_elementwise(x.numel(), [&](std::int64_t i0, std::int64_t i1) {
    ConstArrayMap in(px + i0, i1 - i0);
    ArrayMap o(po + i0, i1 - i0);
    fn(in, o);
  });
  return out;
}

// The same over two tensors of one shape (a: the gradient, b: the saved tensor).
template <typename Fn>
Tensor map2(const Tensor& a, const Tensor& b, Fn&& fn) {
  Tensor af = f32_contiguous(a), bf = f32_contiguous(b);
  Tensor out = empty(a.sizes(), DType::f32);
  if (skip_compute(out)) return out;
  const float* pa = af.data<float>();
  const float* pb = bf.data<float>();
  float* po = out.data<float>();
  parallel_elementwise(a.numel(), [&](std::int64_t i0, std::int64_t i1) {
    ConstArrayMap x(pa + i0, i1 - i0), y(pb + i0, i1 - i0);
    ArrayMap o(po + i0, i1 - i0);
    fn(x, y, o);
  });
  return out;
}

Tensor forward_cpu(UnaryFn f, const Tensor& x, float p) {
  switch (f) {
    case UnaryFn::neg: return map(x, [](const auto& in, auto& o) { o = -in; });
    case UnaryFn::exp: return map(x, [](const auto& in, auto& o) { o = in.exp(); });
    case UnaryFn::log: return map(x, [](const auto& in, auto& o) { o = in.log(); });
    case UnaryFn::sqrt: return map(x, [](const auto& in, auto& o) { o = in.sqrt(); });
    case UnaryFn::rsqrt: return map(x, [](const auto& in, auto& o) { o = in.rsqrt(); });
    case UnaryFn::pow: return map(x, [p](const auto& in, auto& o) { o = in.pow(p); });
    case UnaryFn::abs: return map(x, [](const auto& in, auto& o) { o = in.abs(); });
    case UnaryFn::relu: return map(x, [](const auto& in, auto& o) { o = in.max(0.0f); });
    case UnaryFn::gelu:
      return map(x, [](const auto& in, auto& o) {
        o = 0.5f * in * (1.0f + (kGeluK * (in + kGeluC * in * in * in)).tanh());
      });
    case UnaryFn::silu: return map(x, [](const auto& in, auto& o) { o = in / (1.0f + (-in).exp()); });
    case UnaryFn::sigmoid: return map(x, [](const auto& in, auto& o) { o = 1.0f / (1.0f + (-in).exp()); });
    case UnaryFn::tanh: return map(x, [](const auto& in, auto& o) { o = in.tanh(); });
  }
  throw Error("unary forward: unknown function");
}

// g * f' from the saved tensor s (y or x, see saves_output).
Tensor backward_cpu(UnaryFn f, const Tensor& g, const Tensor& s, float p) {
  switch (f) {
    case UnaryFn::exp: return map2(g, s, [](const auto& gg, const auto& yy, auto& o) { o = gg * yy; });
    case UnaryFn::log: return map2(g, s, [](const auto& gg, const auto& xx, auto& o) { o = gg / xx; });
    case UnaryFn::sqrt: return map2(g, s, [](const auto& gg, const auto& yy, auto& o) { o = gg * 0.5f / yy; });
    case UnaryFn::rsqrt:  // d/dx x^-1/2 = -1/2 x^-3/2 = -1/2 y^3
      return map2(g, s, [](const auto& gg, const auto& yy, auto& o) { o = gg * (-0.5f) * yy * yy * yy; });
    case UnaryFn::pow:
      return map2(g, s, [p](const auto& gg, const auto& xx, auto& o) { o = gg * p * xx.pow(p - 1.0f); });
    case UnaryFn::abs: return map2(g, s, [](const auto& gg, const auto& xx, auto& o) { o = gg * xx.sign(); });
    case UnaryFn::relu:
      return map2(g, s, [](const auto& gg, const auto& yy, auto& o) { o = (yy > 0.0f).select(gg, 0.0f); });
    case UnaryFn::gelu:
      return map2(g, s, [](const auto& gg, const auto& xx, auto& o) {
        const Eigen::ArrayXf t = (kGeluK * (xx + kGeluC * xx * xx * xx)).tanh();
        const Eigen::ArrayXf dinner = kGeluK * (1.0f + 3.0f * kGeluC * xx * xx);
        o = gg * (0.5f * (1.0f + t) + 0.5f * xx * (1.0f - t * t) * dinner);
      });
    case UnaryFn::silu:
      return map2(g, s, [](const auto& gg, const auto& xx, auto& o) {
        const Eigen::ArrayXf sg = 1.0f / (1.0f + (-xx).exp());
        o = gg * sg * (1.0f + xx * (1.0f - sg));
      });
    case UnaryFn::sigmoid:
      return map2(g, s, [](const auto& gg, const auto& yy, auto& o) { o = gg * yy * (1.0f - yy); });
    case UnaryFn::tanh:
      return map2(g, s, [](const auto& gg, const auto& yy, auto& o) { o = gg * (1.0f - yy * yy); });
    case UnaryFn::neg: break;
  }
  throw Error("unary backward: no kernel for this function");
}

const KernelRegistration<UnaryKernels> kCpu(unary_kernels(), DeviceType::CPU, {forward_cpu, backward_cpu},
                                            KernelDTypes::f32);

}  // namespace

Tensor neg(const Tensor& x) { return kNeg.call1({x}, {UnaryFn::neg}); }
Tensor exp(const Tensor& x) { return kExp.call1({x}, {UnaryFn::exp}); }
Tensor log(const Tensor& x) { return kLog.call1({x}, {UnaryFn::log}); }
Tensor sqrt(const Tensor& x) { return kSqrt.call1({x}, {UnaryFn::sqrt}); }
Tensor rsqrt(const Tensor& x) { return kRsqrt.call1({x}, {UnaryFn::rsqrt}); }
Tensor pow(const Tensor& x, double p) { return kPow.call1({x}, {UnaryFn::pow, float(p)}); }
Tensor abs(const Tensor& x) { return kAbs.call1({x}, {UnaryFn::abs}); }
Tensor relu(const Tensor& x) { return kRelu.call1({x}, {UnaryFn::relu}); }
Tensor gelu(const Tensor& x) { return kGelu.call1({x}, {UnaryFn::gelu}); }
Tensor silu(const Tensor& x) { return kSilu.call1({x}, {UnaryFn::silu}); }
Tensor sigmoid(const Tensor& x) { return kSigmoid.call1({x}, {UnaryFn::sigmoid}); }
Tensor tanh(const Tensor& x) { return kTanh.call1({x}, {UnaryFn::tanh}); }

}  // namespace remat
