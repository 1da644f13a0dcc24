// Helpers shared by the files that implement Tensor: tensor.cc (storage,
// element access, factories), tensor_views.cc (the view algebra),
// tensor_copy.cc (copies, casts and fills on and between devices) and
// tensor_print.cc. Internal to engine/.
#pragma once

#include <cstdint>
#include <functional>

#include "engine/tensor.h"

namespace remat::detail {

// Most dims a tensor may have.
inline constexpr std::int64_t kMaxTensorDims = 16;

// Throws ShapeError naming `op` unless `sizes` has at most kMaxTensorDims
// entries, none negative.
void check_dims(const Shape& sizes, const char* op);
// Records `out` as produced from `input` by a one-input op whose backward is
// `bw` (a function of the output gradient), when autograd needs it; returns out.
Tensor with_grad(const Tensor& input, Tensor out, const char* name, std::function<Tensor(const Tensor&)> bw);
// The same for a view `out` of `input` whose elements are pick(input): its
// backward scatters the gradient into zeros of input's shape and dtype, and
// its node's view_region is `pick` (engine/autograd.h).
Tensor with_view_grad(const Tensor& input, Tensor out, const char* name, std::function<Tensor(const Tensor&)> pick);
// Throws AutogradError for an in-place write (`op`) to a tensor that requires
// grad while grad mode is on.
void check_inplace(const Tensor& self, const char* op);
// The element at storage element offset `off` of t, as double (read from the
// device for a CUDA tensor).
double read_element(const Tensor& t, std::int64_t off);
// Throws DeviceError when `t` is a meta tensor (it has no values), naming the
// running op (the allocator's tag) and `what` was asked of it.
void check_has_values(const Tensor& t, const char* what);

}  // namespace remat::detail
