// The in-place updates: definitions (not differentiable) and CPU kernels.
#include "ops/inplace.h"

#include <array>

#include "engine/strided.h"
#include "ops/kernel_util.h"
#include "ops/op.h"

namespace remat {

using namespace ops_detail;

KernelTable<InplaceKernels>& inplace_kernels() {
  static KernelTable<InplaceKernels> t("in-place updates");
  return t;
}

namespace {

struct UpdateState {
  const char* api;       // the public function, as errors name it ("add_", "mul_", ...)
  const char* out_of_place;  // the differentiable op to suggest instead
  UpdateFn fn = UpdateFn::add;
  float alpha = 1.0f;
};

// Throws AutogradError if writing into x (or reading y, when defined) would
// need autograd history that an in-place op cannot record.
void check_writable(const UpdateState& s, const Tensor& x, const Tensor& y) {
  check_defined(s.api, x, "destination");
  REMAT_CHECK(!(grad_enabled() && x.requires_grad()), AutogradError, s.api,
              ": in-place write to a tensor that requires grad (", describe(x),
              ") while grad mode is on; use the out-of-place op (", s.out_of_place,
              "), or a NoGradGuard for updates such as optimizer steps");
  if (y.defined())
    REMAT_CHECK(!(grad_enabled() && y.requires_grad()), AutogradError, s.api, ": the operand ", describe(y),
                " requires grad but ", s.api, " is not differentiable; use the out-of-place op (", s.out_of_place,
                ") or a NoGradGuard");
}

// add_, mul_ (tensor or scalar): x and y floating, one dtype and device, y
// broadcast to x's shape.
void check_update(const OpDef&, const std::vector<Tensor>& in, const UpdateState& s) {
  const Tensor &x = in[0], &y = in.size() > 1 ? in[1] : in[0];
  check_writable(s, x, in.size() > 1 ? in[1] : Tensor());
  check_floating(s.api, x, "destination");
  check_same(s.api, x, y);
  const Shape b = broadcast_shapes(x.sizes(), y.sizes(), s.api);
  REMAT_CHECK(b == x.sizes(), ShapeError, s.api, ": operand ", describe(y),
              " cannot be broadcast to the destination's shape ", shape_str(x.sizes()),
              " (an in-place result keeps the destination's shape)");
}

OpResults update(const std::vector<Tensor>& in, UpdateState& s) {
  Tensor x = in[0];
  Tensor y = (in.size() > 1 ? in[1] : in[0]).detach();
  // An operand that shares memory with x (other than x itself, element for
  // element) is copied first, so no element is read after it was written.
  const bool same_layout =
      y.storage_offset() == x.storage_offset() && y.sizes() == x.sizes() && y.strides() == x.strides();
  if (y.shares_storage_with(x) && !same_layout) y = y.clone();
  y = y.expand(x.sizes());
  x.bump_version();
  inplace_kernels().run(x.device(), &InplaceKernels::update, s.fn, x, y, s.alpha);
  return {{x}};
}

OpCost update_cost(const std::vector<Tensor>& in, const UpdateState&) {
  const double n = double(in[0].numel());
  return {0, 2 * n, 3 * n * double(element_size(in[0].dtype()))};
}

Op<UpdateState> define_update(const char* name, std::vector<const char*> inputs, const char* summary) {
  return Op<UpdateState>({.name = name, .inputs = std::move(inputs), .outputs = {{"x", as_computed()}},
                          .autograd = OpAutograd::none, .summary = summary},
                         {.check = check_update, .forward = update, .cost = update_cost}, &inplace_kernels());
}

const Op<UpdateState> kAdd = define_update("add_", {"x", "y"}, "x += alpha * y, in place");
const Op<UpdateState> kMul = define_update("mul_", {"x", "y"}, "x *= y, in place");
const Op<UpdateState> kScale = define_update("mul_scalar_", {"x"}, "x *= s, in place");

// zero_ and copy_: the engine's own fills and copies (any dtype and device).
void check_zero(const OpDef&, const std::vector<Tensor>& in, const UpdateState& s) {
  check_writable(s, in[0], Tensor());
}

OpResults zero(const std::vector<Tensor>& in, UpdateState&) {
  Tensor x = in[0];
  return {{x.zero_()}};
}

void check_copy(const OpDef&, const std::vector<Tensor>& in, const UpdateState& s) {
  const Tensor &dst = in[0], &src = in[1];
  check_writable(s, dst, src);
  check_defined(s.api, src, "source");
  const Shape b = broadcast_shapes(dst.sizes(), src.sizes(), s.api);
  REMAT_CHECK(b == dst.sizes(), ShapeError, s.api, ": source ", describe(src),
              " cannot be broadcast to the destination's shape ", shape_str(dst.sizes()));
}

OpResults copy(const std::vector<Tensor>& in, UpdateState&) {
  Tensor dst = in[0];
  return {{dst.copy_(in[1])}};
}

const Op<UpdateState> kZero({.name = "zero_", .inputs = {"x"}, .outputs = {{"x", as_computed()}},
                             .autograd = OpAutograd::none, .summary = "x = 0, in place (any dtype)"},
                            {.check = check_zero, .forward = zero});
const Op<UpdateState> kCopy({.name = "copy_", .inputs = {"dst", "src"}, .outputs = {{"dst", as_computed()}},
                             .autograd = OpAutograd::none,
                             .summary = "dst = src, broadcast and converted, in place (any dtypes)"},
                            {.check = check_copy, .forward = copy});

// ---------------------------------------------------------------------------
// CPU kernel (the destination's own dtype, f32 arithmetic)

template <UpdateFn F>
void update_f(Tensor& x, const Tensor& y, float alpha) {
  if (skip_compute(x)) return;
  const std::array<const Shape*, 2> st{&x.strides(), &y.strides()};
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
      T* px = static_cast<T*>(x.raw_data());
      const T* py = static_cast<const T*>(y.raw_data());
      detail::for_each_run<2>(x.sizes(), st, [&](const auto& off, std::int64_t n, const auto& inner) {
        T* a = px + off[0];
        const T* c = py + off[1];
        for (std::int64_t i = 0; i < n; ++i) {
          const float u = float(a[i * inner[0]]);
          if constexpr (F == UpdateFn::add)
            a[i * inner[0]] = T(u + alpha * float(c[i * inner[1]]));
          else if constexpr (F == UpdateFn::mul)
            a[i * inner[0]] = T(u * float(c[i * inner[1]]));
          else
            a[i * inner[0]] = T(u * alpha);
        }
      });
    }
  });
}

void update_cpu(UpdateFn f, Tensor& x, const Tensor& y, float alpha) {
  switch (f) {
    case UpdateFn::add: return update_f<UpdateFn::add>(x, y, alpha);
    case UpdateFn::mul: return update_f<UpdateFn::mul>(x, y, alpha);
    case UpdateFn::scale: return update_f<UpdateFn::scale>(x, y, alpha);
  }
}

const KernelRegistration<InplaceKernels> kCpu(inplace_kernels(), DeviceType::CPU, {update_cpu},
                                              KernelDTypes::native);

}  // namespace

Tensor& add_(Tensor& x, const Tensor& y, double alpha) {
  kAdd({x, y}, {"add_", "add", UpdateFn::add, float(alpha)});
  return x;
}

Tensor& mul_(Tensor& x, double s) {
  kScale({x}, {"mul_", "mul", UpdateFn::scale, float(s)});
  return x;
}

Tensor& mul_(Tensor& x, const Tensor& y) {
  kMul({x, y}, {"mul_", "mul", UpdateFn::mul, 1.0f});
  return x;
}

Tensor& zero_(Tensor& x) {
  kZero({x}, {"zero_", "zeros"});
  return x;
}

Tensor& copy_(Tensor& dst, const Tensor& src) {
  kCopy({dst, src}, {"copy_", "clone"});
  return dst;
}

}  // namespace remat
