#include "ops/unary.h"

#include <Eigen/Core>
#include <cmath>

#include "cuda/elementwise.h"
#include "ops/kernel_util.h"

namespace remat {

using namespace ops_detail;

namespace {

using ArrayMap = Eigen::Map<Eigen::ArrayXf>;
using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf>;

using cuda::UnaryOp;

// Applies `fn(in, out)` (Eigen array maps over one chunk) to x in f32; on
// CUDA the kernel of `code` (param: pow's exponent) does the same.
template <typename Fn>
Tensor map_f32(const char* op, const Tensor& x, UnaryOp code, float param, Fn&& fn) {
  check_floating(op, x, "input");
  check_kernel_device(op, x);
  NoGradGuard ng;
  if constexpr (kHaveCuda) {
    if (on_cuda(x)) {
      Tensor xd = x.detach();
      Tensor out = empty(x.sizes(), TensorOptions(x.dtype(), x.device()));
      cuda::unary(code, out.raw_data(), xd.raw_data(), layout_of(op, xd), x.dtype(), param,
                  cuda_stream());
      return out;
    }
  }
  Tensor xf = f32_contiguous(x);
  Tensor out = empty(x.sizes(), DType::f32);
  const float* px = xf.data<float>();
  float* po = out.data<float>();
  parallel_elementwise(x.numel(), [&](std::int64_t i0, std::int64_t i1) {
    ConstArrayMap in(px + i0, i1 - i0);
    ArrayMap o(po + i0, i1 - i0);
    fn(in, o);
  });
  return from_f32(out, x.dtype());
}

// Same for two inputs of one shape (used by backward kernels: a is the
// incoming gradient, b the saved tensor; the result has a's dtype). On CUDA
// the backward kernel of `code` computes the same formula.
template <typename Fn>
Tensor map2_f32(const char* op, const Tensor& a, const Tensor& b, UnaryOp code, float param,
                Fn&& fn) {
  check_kernel_device(op, a);
  NoGradGuard ng;
  if constexpr (kHaveCuda) {
    if (on_cuda(a)) {
      REMAT_CHECK(a.device() == b.device(), DeviceError, op, ": gradient ", describe(a),
                  " and saved tensor ", describe(b), " are on different devices");
      REMAT_CHECK(a.sizes() == b.sizes(), ShapeError, op, ": gradient ", describe(a),
                  " and saved tensor ", describe(b), " have different shapes");
      // Mixed dtypes: both in f32 (as the CPU computes), one rounding to a's dtype.
      const DType dt = a.dtype() == b.dtype() ? a.dtype() : DType::f32;
      Tensor ad = a.detach().to(dt), bd = b.detach().to(dt);
      Tensor out = empty(a.sizes(), TensorOptions(dt, a.device()));
      cuda::unary_backward(code, out.raw_data(), ad.raw_data(), layout_of(op, ad), bd.raw_data(),
                           layout_of(op, bd), dt, param, cuda_stream());
      return out.to(a.dtype());
    }
  }
  Tensor af = f32_contiguous(a), bf = f32_contiguous(b);
  Tensor out = empty(a.sizes(), DType::f32);
  const float* pa = af.data<float>();
  const float* pb = bf.data<float>();
  float* po = out.data<float>();
  parallel_elementwise(a.numel(), [&](std::int64_t i0, std::int64_t i1) {
    ConstArrayMap x(pa + i0, i1 - i0), y(pb + i0, i1 - i0);
    ArrayMap o(po + i0, i1 - i0);
    fn(x, y, o);
  });
  return from_f32(out, a.dtype());
}

// Records a one-input op whose backward is bw(saved, grad) on one saved
// tensor (the input, or the output when save_output).
template <typename Bw>
Tensor finish(const char* name, const Tensor& x, Tensor out, bool save_output, Bw bw) {
  if (auto node = autograd::make_node(name, {&x})) {
    node->save(save_output ? out : x, save_output);
    node->backward_fn = [bw](Node& n, std::vector<Tensor>& g) {
      return std::vector<Tensor>{bw(n.saved(0), g[0])};
    };
    autograd::set_history(out, node);
  }
  return out;
}

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;

}  // namespace

Tensor neg(const Tensor& x) {
  return dispatch1("neg", {x}, [&] {
    Tensor out = map_f32("neg", x, UnaryOp::neg, 0.0f, [](const auto& in, auto& o) { o = -in; });
    if (auto node = autograd::make_node("neg", {&x})) {
      node->backward_fn = [](Node&, std::vector<Tensor>& g) {
        return std::vector<Tensor>{neg(g[0])};
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

Tensor exp(const Tensor& x) {
  return dispatch1("exp", {x}, [&] {
    Tensor out =
        map_f32("exp", x, UnaryOp::exp, 0.0f, [](const auto& in, auto& o) { o = in.exp(); });
    return finish("exp", x, out, true, [](const Tensor& y, const Tensor& g) {
      return map2_f32("exp_backward", g, y, UnaryOp::exp, 0.0f,
                      [](const auto& gg, const auto& yy, auto& o) { o = gg * yy; });
    });
  });
}

Tensor log(const Tensor& x) {
  return dispatch1("log", {x}, [&] {
    Tensor out =
        map_f32("log", x, UnaryOp::log, 0.0f, [](const auto& in, auto& o) { o = in.log(); });
    return finish("log", x, out, false, [](const Tensor& xs, const Tensor& g) {
      return map2_f32("log_backward", g, xs, UnaryOp::log, 0.0f,
                      [](const auto& gg, const auto& xx, auto& o) { o = gg / xx; });
    });
  });
}

Tensor sqrt(const Tensor& x) {
  return dispatch1("sqrt", {x}, [&] {
    Tensor out =
        map_f32("sqrt", x, UnaryOp::sqrt, 0.0f, [](const auto& in, auto& o) { o = in.sqrt(); });
    return finish("sqrt", x, out, true, [](const Tensor& y, const Tensor& g) {
      return map2_f32("sqrt_backward", g, y, UnaryOp::sqrt, 0.0f,
                      [](const auto& gg, const auto& yy, auto& o) { o = gg * 0.5f / yy; });
    });
  });
}

Tensor rsqrt(const Tensor& x) {
  return dispatch1("rsqrt", {x}, [&] {
    Tensor out =
        map_f32("rsqrt", x, UnaryOp::rsqrt, 0.0f, [](const auto& in, auto& o) { o = in.rsqrt(); });
    return finish("rsqrt", x, out, true, [](const Tensor& y, const Tensor& g) {
      // d/dx x^-1/2 = -1/2 x^-3/2 = -1/2 y^3
      return map2_f32(
          "rsqrt_backward", g, y, UnaryOp::rsqrt, 0.0f,
          [](const auto& gg, const auto& yy, auto& o) { o = gg * (-0.5f) * yy * yy * yy; });
    });
  });
}

Tensor pow(const Tensor& x, double p) {
  return dispatch1("pow", {x}, [&] {
    const float pf = float(p);
    Tensor out =
        map_f32("pow", x, UnaryOp::pow, pf, [pf](const auto& in, auto& o) { o = in.pow(pf); });
    return finish("pow", x, out, false, [pf](const Tensor& xs, const Tensor& g) {
      return map2_f32(
          "pow_backward", g, xs, UnaryOp::pow, pf,
          [pf](const auto& gg, const auto& xx, auto& o) { o = gg * pf * xx.pow(pf - 1.0f); });
    });
  });
}

Tensor abs(const Tensor& x) {
  return dispatch1("abs", {x}, [&] {
    Tensor out =
        map_f32("abs", x, UnaryOp::abs, 0.0f, [](const auto& in, auto& o) { o = in.abs(); });
    return finish("abs", x, out, false, [](const Tensor& xs, const Tensor& g) {
      return map2_f32("abs_backward", g, xs, UnaryOp::abs, 0.0f,
                      [](const auto& gg, const auto& xx, auto& o) { o = gg * xx.sign(); });
    });
  });
}

Tensor relu(const Tensor& x) {
  return dispatch1("relu", {x}, [&] {
    Tensor out =
        map_f32("relu", x, UnaryOp::relu, 0.0f, [](const auto& in, auto& o) { o = in.max(0.0f); });
    return finish("relu", x, out, true, [](const Tensor& y, const Tensor& g) {
      return map2_f32(
          "relu_backward", g, y, UnaryOp::relu, 0.0f,
          [](const auto& gg, const auto& yy, auto& o) { o = (yy > 0.0f).select(gg, 0.0f); });
    });
  });
}

Tensor gelu(const Tensor& x) {
  return dispatch1("gelu", {x}, [&] {
    Tensor out = map_f32("gelu", x, UnaryOp::gelu, 0.0f, [](const auto& in, auto& o) {
      o = 0.5f * in * (1.0f + (kGeluK * (in + kGeluC * in * in * in)).tanh());
    });
    return finish("gelu", x, out, false, [](const Tensor& xs, const Tensor& g) {
      return map2_f32("gelu_backward", g, xs, UnaryOp::gelu, 0.0f,
                      [](const auto& gg, const auto& xx, auto& o) {
                        const Eigen::ArrayXf t = (kGeluK * (xx + kGeluC * xx * xx * xx)).tanh();
                        const Eigen::ArrayXf dinner = kGeluK * (1.0f + 3.0f * kGeluC * xx * xx);
                        o = gg * (0.5f * (1.0f + t) + 0.5f * xx * (1.0f - t * t) * dinner);
                      });
    });
  });
}

Tensor sigmoid(const Tensor& x) {
  return dispatch1("sigmoid", {x}, [&] {
    Tensor out = map_f32("sigmoid", x, UnaryOp::sigmoid, 0.0f,
                         [](const auto& in, auto& o) { o = 1.0f / (1.0f + (-in).exp()); });
    return finish("sigmoid", x, out, true, [](const Tensor& y, const Tensor& g) {
      return map2_f32("sigmoid_backward", g, y, UnaryOp::sigmoid, 0.0f,
                      [](const auto& gg, const auto& yy, auto& o) { o = gg * yy * (1.0f - yy); });
    });
  });
}

Tensor tanh(const Tensor& x) {
  return dispatch1("tanh", {x}, [&] {
    Tensor out =
        map_f32("tanh", x, UnaryOp::tanh, 0.0f, [](const auto& in, auto& o) { o = in.tanh(); });
    return finish("tanh", x, out, true, [](const Tensor& y, const Tensor& g) {
      return map2_f32("tanh_backward", g, y, UnaryOp::tanh, 0.0f,
                      [](const auto& gg, const auto& yy, auto& o) { o = gg * (1.0f - yy * yy); });
    });
  });
}

Tensor silu(const Tensor& x) {
  return dispatch1("silu", {x}, [&] {
    Tensor out = map_f32("silu", x, UnaryOp::silu, 0.0f,
                         [](const auto& in, auto& o) { o = in / (1.0f + (-in).exp()); });
    return finish("silu", x, out, false, [](const Tensor& xs, const Tensor& g) {
      return map2_f32("silu_backward", g, xs, UnaryOp::silu, 0.0f,
                      [](const auto& gg, const auto& xx, auto& o) {
                        const Eigen::ArrayXf s = 1.0f / (1.0f + (-xx).exp());
                        o = gg * s * (1.0f + xx * (1.0f - s));
                      });
    });
  });
}

}  // namespace remat
