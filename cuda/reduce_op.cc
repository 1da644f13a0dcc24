// The reductions' CUDA kernels (cuda/reduce.h) registered for ops/reduce.h:
// x read in place through its layout, results in x's dtype.
#include "cuda/op_util.h"
#include "cuda/reduce.h"
#include "cuda/runtime.h"
#include "ops/reduce.h"

namespace remat::cuda {
namespace {

// t's layout split into the kept dims (in order) and the reduced dims rd (sorted).
void split_layout(const char* op, const Tensor& t, const std::vector<std::int64_t>& rd, Strided& kept,
                  Strided& reduced) {
  const Strided l = layout_of(op, t);
  std::vector<bool> is_red(std::size_t(l.dim), false);
  for (auto d : rd) is_red[std::size_t(d)] = true;
  kept.dim = reduced.dim = 0;
  for (int d = 0; d < l.dim; ++d) {
    Strided& s = is_red[std::size_t(d)] ? reduced : kept;
    s.sizes[s.dim] = l.sizes[d];
    s.strides[s.dim] = l.strides[d];
    ++s.dim;
  }
}

// The output shape of a reduction of `sizes` over rd.
Shape reduced_shape(const Shape& sizes, const std::vector<std::int64_t>& rd, bool keepdim) {
  std::vector<bool> is_red(sizes.size(), false);
  for (auto d : rd) is_red[std::size_t(d)] = true;
  Shape out;
  for (std::size_t d = 0; d < sizes.size(); ++d)
    if (!is_red[d]) out.push_back(sizes[d]);
    else if (keepdim) out.push_back(1);
  return out;
}

Tensor sum(const Tensor& x, const std::vector<std::int64_t>& rd, bool keepdim, float scale) {
  Strided kept, reduced;
  split_layout("sum", x, rd, kept, reduced);
  Tensor out = empty(reduced_shape(x.sizes(), rd, keepdim), TensorOptions(x.dtype(), x.device()));
  const std::int64_t ws = reduce_sum_workspace(kept, reduced);
  Tensor work = ws > 0 ? empty({ws}, TensorOptions(DType::f32, x.device())) : Tensor();
  reduce_sum(out.raw_data(), x.raw_data(), x.dtype(), kept, reduced, scale, ws > 0 ? work.data<float>() : nullptr,
             op_stream());
  return out;
}

std::vector<Tensor> max(const Tensor& x, const std::vector<std::int64_t>& rd, bool keepdim) {
  Strided kept, reduced;
  split_layout("max", x, rd, kept, reduced);
  const Shape shape = reduced_shape(x.sizes(), rd, keepdim);
  Tensor out = empty(shape, TensorOptions(x.dtype(), x.device()));
  Tensor index = empty(shape, TensorOptions(DType::i64, x.device()));
  reduce_max(out.raw_data(), index.data<std::int64_t>(), x.raw_data(), x.dtype(), kept, reduced.numel(),
             reduced.dim > 0 ? reduced.strides[0] : 0, op_stream());
  return {out, index};
}

// Zeros, then each output's gradient written at its argmax.
Tensor max_backward(const Tensor& g, const Tensor& index, const Shape& xs, std::int64_t d, bool, DType dt) {
  const std::vector<std::int64_t> rd = xs.empty() ? std::vector<std::int64_t>{} : std::vector<std::int64_t>{d};
  Tensor gx = zeros(xs, TensorOptions(dt, index.device()));
  Tensor gc = contiguous_detached(g.dtype() == dt ? g : g.to(dt));
  Tensor ic = contiguous_detached(index);
  Strided kept, reduced;
  split_layout("max", gx, rd, kept, reduced);
  reduce_max_backward(gx.raw_data(), kept, reduced.dim > 0 ? reduced.strides[0] : 0, gc.raw_data(),
                      ic.data<std::int64_t>(), dt, op_stream());
  return gx;
}

const KernelRegistration<ReduceKernels> kCuda(reduce_kernels(), DeviceType::CUDA, {sum, max, max_backward},
                                              KernelDTypes::native);

}  // namespace
}  // namespace remat::cuda
