#include "ops/softmax.h"

#include <Eigen/Core>
#include <cmath>

#include "cuda/softmax.h"
#include "ops/kernel_util.h"

namespace remat {

using namespace ops_detail;

namespace {

using ArrayMap = Eigen::Map<Eigen::ArrayXf>;
using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf>;

// A tensor with `dim` moved last, as a contiguous f32 [rows, n] matrix, and
// how to put a result of that layout back.
struct RowLayout {
  std::int64_t dim = 0;
  bool moved = false;  // dim was not the last one
  Shape perm, inverse;
  std::int64_t rows = 0, n = 1;
};

RowLayout row_layout(const Tensor& x, std::int64_t dim, const char* op) {
  RowLayout l;
  const std::int64_t nd = x.dim();
  l.dim = wrap_dim(dim, nd, op);
  l.n = nd == 0 ? 1 : x.size(l.dim);
  l.rows = l.n == 0 ? 0 : x.numel() / l.n;
  l.moved = nd > 0 && l.dim != nd - 1;
  if (l.moved) {
    for (std::int64_t d = 0; d < nd; ++d)
      if (d != l.dim) l.perm.push_back(d);
    l.perm.push_back(l.dim);
    l.inverse.resize(std::size_t(nd));
    for (std::int64_t i = 0; i < nd; ++i) l.inverse[std::size_t(l.perm[std::size_t(i)])] = i;
  }
  return l;
}

// `t` in row layout (contiguous f32). Call under NoGradGuard.
Tensor to_rows(const Tensor& t, const RowLayout& l) {
  Tensor v = t.detach();
  if (l.moved) v = v.permute(l.perm);
  return f32_contiguous(v);
}

// A row-layout f32 result back in the original layout, as `dtype`.
Tensor from_rows(const Tensor& rows, const RowLayout& l, DType dtype) {
  Tensor out = l.moved ? rows.permute(l.inverse).contiguous() : rows;
  return from_f32(out, dtype);
}

// For the CUDA kernels: `t` in row layout, contiguous in `dtype`. Call under NoGradGuard.
Tensor to_rows_cuda(const Tensor& t, const RowLayout& l, DType dtype) {
  Tensor v = t.detach();
  if (v.dtype() != dtype) v = v.to(dtype);
  if (l.moved) v = v.permute(l.perm);
  return contiguous_detached(v);
}

// A row-layout CUDA result back in the original layout.
Tensor from_rows_cuda(const Tensor& rows, const RowLayout& l) {
  return l.moved ? rows.permute(l.inverse).contiguous() : rows;
}

// Forward over rows: softmax, or log_softmax when `log`.
Tensor softmax_kernel(const Tensor& x, const RowLayout& l, bool log) {
  NoGradGuard ng;
  if constexpr (kHaveCuda) {
    if (on_cuda(x)) {
      Tensor xr = to_rows_cuda(x, l, x.dtype());
      Tensor out = empty(xr.sizes(), TensorOptions(x.dtype(), x.device()));
      cuda::softmax_forward(out.raw_data(), xr.raw_data(), x.dtype(), l.rows, l.n, log, cuda_stream());
      return from_rows_cuda(out, l);
    }
  }
  Tensor xr = to_rows(x, l);
  Tensor out = empty(xr.sizes(), DType::f32);
  const float* px = xr.data<float>();
  float* po = out.data<float>();
  const std::int64_t n = l.n;
  parallel_rows(l.rows, n, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      ConstArrayMap in(px + r * n, n);
      ArrayMap o(po + r * n, n);
      const float m = in.maxCoeff();
      o = (in - m).exp();
      const float s = lane_sum(o.data(), n);
      if (log) {
        const float ls = std::log(s);
        o = (in - m) - ls;
      } else {
        o *= 1.0f / s;
      }
    }
  });
  return from_rows(out, l, x.dtype());
}

// dx = y * (g - sum(g * y)) for softmax; dx = g - exp(y) * sum(g) for log_softmax.
Tensor softmax_backward_kernel(const Tensor& g, const Tensor& y, const RowLayout& l, bool log,
                               DType dtype) {
  NoGradGuard ng;
  if constexpr (kHaveCuda) {
    if (on_cuda(y)) {
      Tensor gr = to_rows_cuda(g, l, dtype), yr = to_rows_cuda(y, l, dtype);
      Tensor dx = empty(gr.sizes(), TensorOptions(dtype, y.device()));
      cuda::softmax_backward(dx.raw_data(), gr.raw_data(), yr.raw_data(), dtype, l.rows, l.n, log, cuda_stream());
      return from_rows_cuda(dx, l);
    }
  }
  Tensor gr = to_rows(g, l), yr = to_rows(y, l);
  Tensor dx = empty(gr.sizes(), DType::f32);
  const float* pg = gr.data<float>();
  const float* py = yr.data<float>();
  float* pd = dx.data<float>();
  const std::int64_t n = l.n;
  parallel_rows(l.rows, n, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* gg = pg + r * n;
      const float* yy = py + r * n;
      float* d = pd + r * n;
      if (log) {
        const float s = lane_sum(gg, n);
        ArrayMap o(d, n);
        o = ConstArrayMap(yy, n).exp();
        for (std::int64_t i = 0; i < n; ++i) d[i] = gg[i] - d[i] * s;
      } else {
        const float s = lane_dot(gg, yy, n);
        for (std::int64_t i = 0; i < n; ++i) d[i] = yy[i] * (gg[i] - s);
      }
    }
  });
  return from_rows(dx, l, dtype);
}

Tensor softmax_impl(const char* name, const Tensor& x, std::int64_t dim, bool log) {
  check_floating(name, x, "input");
  check_kernel_device(name, x);
  const RowLayout l = row_layout(x, dim, name);
  return dispatch1(name, {x}, [&] {
    Tensor out = softmax_kernel(x, l, log);
    if (auto node = autograd::make_node(name, {&x})) {
      node->save(out, /*is_output=*/true);
      node->backward_fn = [l, log, dt = x.dtype()](Node& n, std::vector<Tensor>& g) {
        return std::vector<Tensor>{softmax_backward_kernel(g[0], n.saved(0), l, log, dt)};
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

}  // namespace

Tensor softmax(const Tensor& x, std::int64_t dim) { return softmax_impl("softmax", x, dim, false); }

Tensor log_softmax(const Tensor& x, std::int64_t dim) {
  return softmax_impl("log_softmax", x, dim, true);
}

}  // namespace remat
