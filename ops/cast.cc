#include "ops/cast.h"

#include "ops/kernel_util.h"

namespace remat {

using namespace ops_detail;

Tensor cast(const Tensor& x, DType dtype) {
  check_defined("cast", x, "input");
  REMAT_CHECK(is_floating(dtype) || !(grad_enabled() && x.requires_grad()), DTypeError,
              "cast: cannot cast ", describe(x), " to ", dtype,
              " while it requires grad: gradients only flow through floating dtypes (f32, bf16, "
              "f16); cast x.detach() or use NoGradGuard to take a non-differentiable copy");
  if (dtype == x.dtype()) return x;
  // Tensor::to records the "cast" node (backward: g.to(x's dtype)).
  return dispatch1("cast", {x}, [&] { return x.to(dtype); });
}

}  // namespace remat
