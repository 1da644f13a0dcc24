#include "ops/binary.h"

#include <array>

#include "cuda/elementwise.h"
#include "engine/strided.h"
#include "ops/kernel_util.h"

namespace remat {

using namespace ops_detail;

namespace {

enum class BinOp { add, sub, mul, div };

constexpr cuda::BinaryOp cuda_op(BinOp k) {
  switch (k) {
    case BinOp::add: return cuda::BinaryOp::add;
    case BinOp::sub: return cuda::BinaryOp::sub;
    case BinOp::mul: return cuda::BinaryOp::mul;
    case BinOp::div: return cuda::BinaryOp::div;
  }
  return cuda::BinaryOp::add;
}

template <BinOp K>
inline float apply(float a, float b) {
  if constexpr (K == BinOp::add) return a + b;
  if constexpr (K == BinOp::sub) return a - b;
  if constexpr (K == BinOp::mul) return a * b;
  return a / b;
}

// out = a (op) b with broadcasting, computed in f32.
template <BinOp K>
Tensor binary_kernel(const char* op, const Tensor& a, const Tensor& b) {
  check_floating(op, a, "first operand");
  check_same(op, a, b);
  check_kernel_device(op, a);
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), op);
  NoGradGuard ng;
  if constexpr (kHaveCuda) {
    if (on_cuda(a)) {
      // Both operands read in place through their (broadcast) strides.
      Tensor ea = a.detach().expand(shape), eb = b.detach().expand(shape);
      Tensor out = empty(shape, TensorOptions(a.dtype(), a.device()));
      cuda::binary(cuda_op(K), out.raw_data(), ea.raw_data(), layout_of(op, ea), eb.raw_data(),
                   layout_of(op, eb), a.dtype(), cuda_stream());
      return out;
    }
  }
  Tensor af = a.dtype() == DType::f32 ? a.detach() : a.detach().to(DType::f32);
  Tensor bf = b.dtype() == DType::f32 ? b.detach() : b.detach().to(DType::f32);
  Tensor out = empty(shape, DType::f32);
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
  return from_f32(out, a.dtype());
}

Tensor scalar_like(const Tensor& a, double s) {
  return full({}, s, TensorOptions(a.dtype(), a.device()));
}

// s as a one-element tensor of dtype t holds it (t's rounding of float(s)).
float rounded_scalar(double s, DType t) {
  return dispatch_dtype(t, [&](auto tag) { return float(to_double(from_double<decltype(tag)>(s))); });
}

// a (op) s, or s (op) a when scalar_first, for a scalar s taken in a's dtype.
template <BinOp K>
Tensor scalar_kernel(const char* op, const Tensor& a, double s, bool scalar_first) {
  check_defined(op, a, "input");
  if constexpr (kHaveCuda) {
    if (on_cuda(a)) {
      check_floating(op, a, "input");
      NoGradGuard ng;
      Tensor ad = a.detach();
      Tensor out = empty(a.sizes(), TensorOptions(a.dtype(), a.device()));
      cuda::binary_scalar(cuda_op(K), out.raw_data(), ad.raw_data(), layout_of(op, ad),
                          rounded_scalar(s, a.dtype()), scalar_first, a.dtype(), cuda_stream());
      return out;
    }
  }
  return scalar_first ? binary_kernel<K>(op, scalar_like(a, s).expand(a.sizes()), a)
                      : binary_kernel<K>(op, a, scalar_like(a, s));
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  return dispatch1("add", {a, b}, [&] {
    Tensor out = binary_kernel<BinOp::add>("add", a, b);
    if (auto node = autograd::make_node("add", {&a, &b})) {
      node->backward_fn = [sa = a.sizes(), sb = b.sizes()](Node& n, std::vector<Tensor>& g) {
        return std::vector<Tensor>{n.needs_input_grad(0) ? detail::sum_to_shape(g[0], sa) : Tensor(),
                                   n.needs_input_grad(1) ? detail::sum_to_shape(g[0], sb) : Tensor()};
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  return dispatch1("sub", {a, b}, [&] {
    Tensor out = binary_kernel<BinOp::sub>("sub", a, b);
    if (auto node = autograd::make_node("sub", {&a, &b})) {
      node->backward_fn = [sa = a.sizes(), sb = b.sizes()](Node& n, std::vector<Tensor>& g) {
        return std::vector<Tensor>{
            n.needs_input_grad(0) ? detail::sum_to_shape(g[0], sa) : Tensor(),
            n.needs_input_grad(1) ? detail::sum_to_shape(mul(g[0], -1.0), sb) : Tensor()};
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  return dispatch1("mul", {a, b}, [&] {
    Tensor out = binary_kernel<BinOp::mul>("mul", a, b);
    if (auto node = autograd::make_node("mul", {&a, &b})) {
      // Each input's gradient needs the other input.
      node->save(node->needs_input_grad(1) ? a : Tensor());
      node->save(node->needs_input_grad(0) ? b : Tensor());
      node->backward_fn = [sa = a.sizes(), sb = b.sizes()](Node& n, std::vector<Tensor>& g) {
        Tensor ga, gb;
        if (n.needs_input_grad(0)) ga = detail::sum_to_shape(mul(g[0], n.saved(1)), sa);
        if (n.needs_input_grad(1)) gb = detail::sum_to_shape(mul(g[0], n.saved(0)), sb);
        return std::vector<Tensor>{ga, gb};
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  return dispatch1("div", {a, b}, [&] {
    Tensor out = binary_kernel<BinOp::div>("div", a, b);
    if (auto node = autograd::make_node("div", {&a, &b})) {
      node->save(b);
      node->save(node->needs_input_grad(1) ? out : Tensor(), /*is_output=*/true);
      node->backward_fn = [sa = a.sizes(), sb = b.sizes()](Node& n, std::vector<Tensor>& g) {
        Tensor ga, gb;
        Tensor bb = n.saved(0);
        Tensor gq = div(g[0], bb);  // d/da = 1/b
        if (n.needs_input_grad(0)) ga = detail::sum_to_shape(gq, sa);
        // d/db = -a/b^2 = -(a/b)/b = -out/b
        if (n.needs_input_grad(1)) gb = detail::sum_to_shape(mul(mul(gq, n.saved(1)), -1.0), sb);
        return std::vector<Tensor>{ga, gb};
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

Tensor add(const Tensor& a, double s) {
  return dispatch1("add_scalar", {a}, [&] {
    Tensor out = scalar_kernel<BinOp::add>("add_scalar", a, s, false);
    if (auto node = autograd::make_node("add_scalar", {&a})) {
      node->backward_fn = [](Node&, std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; };
      autograd::set_history(out, node);
    }
    return out;
  });
}

Tensor sub(const Tensor& a, double s) { return add(a, -s); }

Tensor mul(const Tensor& a, double s) {
  return dispatch1("mul_scalar", {a}, [&] {
    Tensor out = scalar_kernel<BinOp::mul>("mul_scalar", a, s, false);
    if (auto node = autograd::make_node("mul_scalar", {&a})) {
      node->backward_fn = [s](Node&, std::vector<Tensor>& g) {
        return std::vector<Tensor>{mul(g[0], s)};
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

Tensor div(const Tensor& a, double s) { return mul(a, 1.0 / s); }

Tensor rsub(const Tensor& a, double s) {
  return dispatch1("rsub_scalar", {a}, [&] {
    Tensor out = scalar_kernel<BinOp::sub>("rsub_scalar", a, s, true);
    if (auto node = autograd::make_node("rsub_scalar", {&a})) {
      node->backward_fn = [](Node&, std::vector<Tensor>& g) {
        return std::vector<Tensor>{mul(g[0], -1.0)};
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

}  // namespace remat
