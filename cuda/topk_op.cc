// topk's CUDA kernels (cuda/topk.h) registered for ops/topk.h: one warp per
// row reads x in place (any layout, its own dtype).
#include "cuda/op_util.h"
#include "cuda/runtime.h"
#include "cuda/topk.h"
#include "ops/topk.h"

namespace remat::cuda {
namespace {

// `t`'s layout without dim d: the rows along d, as cuda/topk.h takes them.
Strided rows_layout(const Tensor& t, std::int64_t d) {
  const Strided full = layout_of("topk", t);
  Strided r;
  for (int k = 0; k < full.dim; ++k) {
    if (k == d) continue;
    r.sizes[r.dim] = full.sizes[k];
    r.strides[r.dim] = full.strides[k];
    ++r.dim;
  }
  return r;
}

std::vector<Tensor> forward(const Tensor& x_in, std::int64_t k, std::int64_t d, bool largest) {
  const Tensor x = x_in.detach();
  Shape shape = x.sizes();
  shape[std::size_t(d)] = k;
  Tensor values = empty(shape, TensorOptions(x.dtype(), x.device()));
  Tensor indices = empty(shape, TensorOptions(DType::i64, x.device()));
  topk(x.raw_data(), x.dtype(), rows_layout(x, d), x.stride(d), x.size(d), values.raw_data(),
       indices.data<std::int64_t>(), rows_layout(values, d), values.stride(d), k, largest, op_stream());
  return {values, indices};
}

// g placed at the picked entries of a zero tensor of x's shape (0 + g, as the
// CPU's scatter_add into zeros).
Tensor backward(const Tensor& g_in, const Tensor& indices, const Shape& xs, std::int64_t d, DType dt) {
  const Tensor g = g_in.dtype() == dt ? g_in : g_in.to(dt);
  Tensor gx = empty(xs, TensorOptions(dt, g.device()));
  memset_async(gx.raw_data(), 0, gx.nbytes(), op_stream());
  topk_backward(gx.raw_data(), rows_layout(gx, d), gx.stride(d), g.raw_data(), rows_layout(g, d), g.stride(d),
                indices.data<std::int64_t>(), rows_layout(indices, d), indices.stride(d), dt, g.size(d), op_stream());
  return gx;
}

const KernelRegistration<TopkKernels> kCuda(topk_kernels(), DeviceType::CUDA, {forward, backward},
                                            KernelDTypes::native);

}  // namespace
}  // namespace remat::cuda
