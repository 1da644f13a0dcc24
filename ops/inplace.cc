#include "ops/inplace.h"

#include <array>

#include "cuda/elementwise.h"
#include "engine/strided.h"
#include "ops/kernel_util.h"

namespace remat {

using namespace ops_detail;

namespace {

// Throws AutogradError if writing into `x` (or reading `y`, when defined)
// would need autograd history that an in-place op cannot record.
void check_writable(const char* op, const char* out_of_place, const Tensor& x, const Tensor& y) {
  check_defined(op, x, "destination");
  REMAT_CHECK(!(grad_enabled() && x.requires_grad()), AutogradError, op,
              ": in-place write to a tensor that requires grad (", describe(x),
              ") while grad mode is on; use the out-of-place op (", out_of_place,
              "), or a NoGradGuard for updates such as optimizer steps");
  if (y.defined())
    REMAT_CHECK(!(grad_enabled() && y.requires_grad()), AutogradError, op, ": the operand ",
                describe(y), " requires grad but ", op,
                " is not differentiable; use the out-of-place op (", out_of_place,
                ") or a NoGradGuard");
}

enum class Kind { add, mul, scale };

// x = x + alpha * y (add), x * y (mul) or x * alpha (scale; y unused, pass
// x), y broadcast to x, in f32, element by element through x's strides.
template <Kind K>
void update_kernel(const char* op, Tensor& x, const Tensor& y_in, float alpha) {
  check_floating(op, x, "destination");
  check_same(op, x, y_in);
  check_kernel_device(op, x);
  const Shape b = broadcast_shapes(x.sizes(), y_in.sizes(), op);
  REMAT_CHECK(b == x.sizes(), ShapeError, op, ": operand ", describe(y_in),
              " cannot be broadcast to the destination's shape ", shape_str(x.sizes()),
              " (an in-place result keeps the destination's shape)");
  NoGradGuard ng;
  Tensor y = y_in.detach();
  // An operand that shares memory with x (other than x itself, element for
  // element) is copied first, so no element is read after it was written.
  const bool same_layout = y.storage_offset() == x.storage_offset() && y.sizes() == x.sizes() &&
                           y.strides() == x.strides();
  if (y.shares_storage_with(x) && !same_layout) y = y.clone();
  y = y.expand(x.sizes());
  x.bump_version();
  if constexpr (kHaveCuda) {
    if (on_cuda(x)) {
      constexpr cuda::UpdateOp code = K == Kind::add   ? cuda::UpdateOp::add
                                      : K == Kind::mul ? cuda::UpdateOp::mul
                                                       : cuda::UpdateOp::scale;
      cuda::update(code, x.raw_data(), layout_of(op, x), y.raw_data(), layout_of(op, y), alpha,
                   x.dtype(), cuda_stream());
      return;
    }
  }
  const std::array<const Shape*, 2> st{&x.strides(), &y.strides()};
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
      T* px = static_cast<T*>(x.raw_data());
      const T* py = static_cast<const T*>(y.raw_data());
      detail::for_each_run<2>(x.sizes(), st, [&](const auto& off, std::int64_t n,
                                                 const auto& inner) {
        T* a = px + off[0];
        const T* c = py + off[1];
        for (std::int64_t i = 0; i < n; ++i) {
          const float u = float(a[i * inner[0]]);
          if constexpr (K == Kind::add)
            a[i * inner[0]] = T(u + alpha * float(c[i * inner[1]]));
          else if constexpr (K == Kind::mul)
            a[i * inner[0]] = T(u * float(c[i * inner[1]]));
          else
            a[i * inner[0]] = T(u * alpha);
        }
      });
    }
  });
}

}  // namespace

Tensor& add_(Tensor& x, const Tensor& y, double alpha) {
  check_writable("add_", "add", x, y);
  dispatch1("add_", {x, y}, [&] {
    update_kernel<Kind::add>("add_", x, y, float(alpha));
    return x;
  });
  return x;
}

Tensor& mul_(Tensor& x, double s) {
  check_writable("mul_", "mul", x, Tensor());
  dispatch1("mul_scalar_", {x}, [&] {
    update_kernel<Kind::scale>("mul_", x, x, float(s));
    return x;
  });
  return x;
}

Tensor& mul_(Tensor& x, const Tensor& y) {
  check_writable("mul_", "mul", x, y);
  dispatch1("mul_", {x, y}, [&] {
    update_kernel<Kind::mul>("mul_", x, y, 1.0f);
    return x;
  });
  return x;
}

Tensor& zero_(Tensor& x) {
  check_writable("zero_", "zeros", x, Tensor());
  dispatch1("zero_", {x}, [&] { return x.zero_(); });
  return x;
}

Tensor& copy_(Tensor& dst, const Tensor& src) {
  check_writable("copy_", "clone", dst, src);
  check_defined("copy_", src, "source");
  const Shape b = broadcast_shapes(dst.sizes(), src.sizes(), "copy_");
  REMAT_CHECK(b == dst.sizes(), ShapeError, "copy_: source ", describe(src),
              " cannot be broadcast to the destination's shape ", shape_str(dst.sizes()));
  dispatch1("copy_", {dst, src}, [&] { return dst.copy_(src); });
  return dst;
}

}  // namespace remat
