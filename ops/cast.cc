// cast: a dtype conversion, differentiable between floating dtypes (the
// engine's Tensor::to records it).
#include "ops/cast.h"

#include "ops/kernel_util.h"
#include "ops/op.h"

namespace remat {

using namespace ops_detail;

namespace {

struct CastState {
  DType dtype;
};

void check(const OpDef& op, const std::vector<Tensor>& in, const CastState& s) {
  const Tensor& x = in[0];
  REMAT_CHECK(is_floating(s.dtype) || !(grad_enabled() && x.requires_grad()), DTypeError, op.name(),
              ": cannot cast ", describe(x), " to ", s.dtype,
              " while it requires grad: gradients only flow through floating dtypes (f32, bf16, "
              "f16); cast x.detach() or use NoGradGuard to take a non-differentiable copy");
}

// Tensor::to records the "cast" node (backward: g.to(x's dtype)).
OpResults forward(const std::vector<Tensor>& in, CastState& s) { return {{in[0].to(s.dtype)}}; }

OpCost cost(const std::vector<Tensor>& in, const CastState& s) {
  const double n = double(in[0].numel());
  return {0, 0, n * double(element_size(in[0].dtype()) + element_size(s.dtype))};
}

const Op<CastState> kCast({.name = "cast", .inputs = {"x"}, .outputs = {{"y", as_computed()}},
                           .autograd = OpAutograd::inner, .summary = "dtype conversion (round to nearest even)"},
                          {.check = check, .forward = forward, .cost = cost});

}  // namespace

Tensor cast(const Tensor& x, DType dtype) {
  check_defined("cast", x, "input");
  if (dtype == x.dtype()) return x;
  return kCast.call1({x}, {dtype});
}

}  // namespace remat
