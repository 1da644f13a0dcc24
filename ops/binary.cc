// The arithmetic ops (tensor and scalar forms): definitions and CPU kernels.
#include "ops/binary.h"

#include <array>

#include "engine/strided.h"
#include "ops/kernel_util.h"
#include "ops/op.h"

namespace remat {

using namespace ops_detail;

KernelTable<BinaryKernels>& binary_kernels() {
  static KernelTable<BinaryKernels> t("arithmetic ops");
  return t;
}

namespace {

// ---------------------------------------------------------------------------
// Tensor (op) tensor

struct BinaryState {
  BinaryFn fn;
};

void check_binary(const OpDef& op, const std::vector<Tensor>& in, const BinaryState&) {
  check_floating(op.name(), in[0], "first operand");
  check_same(op.name(), in[0], in[1]);
  broadcast_shapes(in[0].sizes(), in[1].sizes(), op.name());
}

OpResults forward_binary(const std::vector<Tensor>& in, BinaryState& s) {
  return {{binary_kernels().run(in[0].device(), &BinaryKernels::binary, s.fn, in[0], in[1])}};
}

// The gradients of a (f) b: g reduced over broadcast dims to each operand's shape.
std::vector<Tensor> backward_binary(const OpBackward<BinaryState>& b) {
  const Tensor& g = b.grad();
  const Shape &sa = b.input(0).sizes, &sb = b.input(1).sizes;
  Tensor ga, gb;
  switch (b.state().fn) {
    case BinaryFn::add:
      if (b.needs(0)) ga = detail::sum_to_shape(g, sa);
      if (b.needs(1)) gb = detail::sum_to_shape(g, sb);
      break;
    case BinaryFn::sub:
      if (b.needs(0)) ga = detail::sum_to_shape(g, sa);
      if (b.needs(1)) gb = detail::sum_to_shape(mul(g, -1.0), sb);
      break;
    case BinaryFn::mul:  // each input's gradient needs the other input
      if (b.needs(0)) ga = detail::sum_to_shape(mul(g, b.saved("b")), sa);
      if (b.needs(1)) gb = detail::sum_to_shape(mul(g, b.saved("a")), sb);
      break;
    case BinaryFn::div: {
      const Tensor gq = div(g, b.saved("b"));  // d/da = 1/b
      if (b.needs(0)) ga = detail::sum_to_shape(gq, sa);
      // d/db = -a/b^2 = -(a/b)/b = -out/b
      if (b.needs(1)) gb = detail::sum_to_shape(mul(mul(gq, b.saved("out")), -1.0), sb);
      break;
    }
  }
  return {ga, gb};
}

OpCost cost_binary(const std::vector<Tensor>& in, const BinaryState&) {
  const double n = double(shape_numel(broadcast_shapes(in[0].sizes(), in[1].sizes(), "cost")));
  const double es = double(element_size(in[0].dtype()));
  return {0, n, (double(in[0].numel()) + double(in[1].numel()) + n) * es};
}

Op<BinaryState> define_binary(const char* name, std::vector<SaveSpec> saves, const char* summary) {
  return Op<BinaryState>({.name = name, .inputs = {"a", "b"}, .outputs = {{"out"}}, .saves = std::move(saves),
                          .summary = summary},
                         {.check = check_binary, .forward = forward_binary, .backward = backward_binary,
                          .cost = cost_binary},
                         &binary_kernels());
}

const Op<BinaryState> kAdd = define_binary("add", {}, "a + b, broadcasting");
const Op<BinaryState> kSub = define_binary("sub", {}, "a - b, broadcasting");
const Op<BinaryState> kMul = define_binary(
    "mul", {{"a", SaveFrom::input, 0, inputs_mask({1})}, {"b", SaveFrom::input, 1, inputs_mask({0})}},
    "a * b, broadcasting");
const Op<BinaryState> kDiv = define_binary(
    "div", {{"b", SaveFrom::input, 1}, {"out", SaveFrom::output, 0, inputs_mask({1})}}, "a / b, broadcasting");

// ---------------------------------------------------------------------------
// Tensor (op) scalar

struct ScalarState {
  BinaryFn fn;
  double s = 0;
  bool scalar_first = false;  // s (op) a
};

// s as a one-element tensor of dtype t holds it (t's rounding of float(s)).
float rounded_scalar(double s, DType t) {
  return visit_dtype(t, [&](auto tag) { return float(to_double(from_double<decltype(tag)>(s))); });
}

void check_scalar(const OpDef& op, const std::vector<Tensor>& in, const ScalarState&) {
  check_floating(op.name(), in[0], "input");
}

OpResults forward_scalar(const std::vector<Tensor>& in, ScalarState& s) {
  const Tensor& a = in[0];
  return {{binary_kernels().run(a.device(), &BinaryKernels::scalar, s.fn, a, rounded_scalar(s.s, a.dtype()),
                                s.scalar_first)}};
}

std::vector<Tensor> backward_scalar(const OpBackward<ScalarState>& b) {
  const ScalarState& s = b.state();
  if (s.fn == BinaryFn::mul) return {mul(b.grad(), s.s)};
  if (s.scalar_first) return {mul(b.grad(), -1.0)};  // s - a
  return {b.grad()};
}

OpCost cost_scalar(const std::vector<Tensor>& in, const ScalarState&) {
  const double n = double(in[0].numel());
  return {0, n, 2 * n * double(element_size(in[0].dtype()))};
}

Op<ScalarState> define_scalar(const char* name, const char* summary) {
  return Op<ScalarState>({.name = name, .inputs = {"a"}, .outputs = {{"out"}}, .summary = summary},
                         {.check = check_scalar, .forward = forward_scalar, .backward = backward_scalar,
                          .cost = cost_scalar},
                         &binary_kernels());
}

const Op<ScalarState> kAddScalar = define_scalar("add_scalar", "a + s (and a - s)");
const Op<ScalarState> kMulScalar = define_scalar("mul_scalar", "a * s (and a / s)");
const Op<ScalarState> kRsubScalar = define_scalar("rsub_scalar", "s - a");

// ---------------------------------------------------------------------------
// CPU kernels (f32)

template <BinaryFn K>
inline float apply(float a, float b) {
  if constexpr (K == BinaryFn::add) return a + b;
  if constexpr (K == BinaryFn::sub) return a - b;
  if constexpr (K == BinaryFn::mul) return a * b;
  return a / b;
}

// out = a (K) b with broadcasting.
template <BinaryFn K>
Tensor binary_f32(const Tensor& a, const Tensor& b) {
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), "binary kernel");
  Tensor af = a.detach(), bf = b.detach();
  Tensor out = empty(shape, DType::f32);
  if (skip_compute(out)) return out;
  float* po = out.data<float>();
  const float* pa = af.data<float>();
  const float* pb = bf.data<float>();
  const std::int64_t n = out.numel();
  if (af.sizes() == shape && bf.sizes() == shape && af.is_contiguous() && bf.is_contiguous()) {
    parallel_elementwise(n, [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i) po[i] = apply<K>(pa[i], pb[i]);
    });
  } else if (bf.numel() == 1 && af.sizes() == shape && af.is_contiguous()) {
    const float s = pb[0];
    parallel_elementwise(n, [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i) po[i] = apply<K>(pa[i], s);
    });
  } else {
    Tensor ea = af.expand(shape), eb = bf.expand(shape);
    const std::array<const Shape*, 3> st{&out.strides(), &ea.strides(), &eb.strides()};
    detail::for_each_run<3>(shape, st, [&](const auto& off, std::int64_t len, const auto& inner) {
      float* o = po + off[0];
      const float* x = pa + off[1];
      const float* y = pb + off[2];
      if (inner[1] == 1 && inner[2] == 1) {
        for (std::int64_t i = 0; i < len; ++i) o[i] = apply<K>(x[i], y[i]);
      } else if (inner[1] == 1 && inner[2] == 0) {
        const float s = y[0];
        for (std::int64_t i = 0; i < len; ++i) o[i] = apply<K>(x[i], s);
      } else if (inner[1] == 0 && inner[2] == 1) {
        const float s = x[0];
        for (std::int64_t i = 0; i < len; ++i) o[i] = apply<K>(s, y[i]);
      } else {
        for (std::int64_t i = 0; i < len; ++i) o[i] = apply<K>(x[i * inner[1]], y[i * inner[2]]);
      }
    });
  }
  return out;
}

Tensor binary_cpu(BinaryFn f, const Tensor& a, const Tensor& b) {
  switch (f) {
    case BinaryFn::add: return binary_f32<BinaryFn::add>(a, b);
    case BinaryFn::sub: return binary_f32<BinaryFn::sub>(a, b);
    case BinaryFn::mul: return binary_f32<BinaryFn::mul>(a, b);
    case BinaryFn::div: return binary_f32<BinaryFn::div>(a, b);
  }
  throw Error("binary kernel: unknown function");
}

// The scalar as a one-element tensor, through the broadcasting kernel.
Tensor scalar_cpu(BinaryFn f, const Tensor& a, float s, bool scalar_first) {
  const Tensor st = full({}, double(s), DType::f32);
  return scalar_first ? binary_cpu(f, st.expand(a.sizes()), a) : binary_cpu(f, a, st);
}

const KernelRegistration<BinaryKernels> kCpu(binary_kernels(), DeviceType::CPU, {binary_cpu, scalar_cpu},
                                             KernelDTypes::f32);

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return kAdd.call1({a, b}, {BinaryFn::add}); }
Tensor sub(const Tensor& a, const Tensor& b) { return kSub.call1({a, b}, {BinaryFn::sub}); }
Tensor mul(const Tensor& a, const Tensor& b) { return kMul.call1({a, b}, {BinaryFn::mul}); }
Tensor div(const Tensor& a, const Tensor& b) { return kDiv.call1({a, b}, {BinaryFn::div}); }

Tensor add(const Tensor& a, double s) { return kAddScalar.call1({a}, {BinaryFn::add, s}); }
Tensor sub(const Tensor& a, double s) { return add(a, -s); }
Tensor mul(const Tensor& a, double s) { return kMulScalar.call1({a}, {BinaryFn::mul, s}); }
Tensor div(const Tensor& a, double s) { return mul(a, 1.0 / s); }
Tensor rsub(const Tensor& a, double s) { return kRsubScalar.call1({a}, {BinaryFn::sub, s, true}); }

}  // namespace remat
