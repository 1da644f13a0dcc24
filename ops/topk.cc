#include "ops/topk.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>

#include "cuda/runtime.h"
#include "cuda/topk.h"
#include "ops/index.h"
#include "ops/kernel_util.h"

namespace remat {

using namespace ops_detail;

namespace {

// True if a (at index ia) ranks before b (at index ib): a strict total order,
// so the top k are unique. NaN ranks above every number for `largest` and
// below for smallest; equal values go to the lower index.
inline bool ranks_before(float a, std::int64_t ia, float b, std::int64_t ib, bool largest) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na || nb) {
    if (na && nb) return ia < ib;
    return largest ? na : nb;
  }
  if (a != b) return largest ? a > b : a < b;
  return ia < ib;
}

// `t`'s layout without dim d: the rows along d, as cuda/topk.h takes them.
cuda::Strided rows_layout(const Tensor& t, std::int64_t d) {
  const cuda::Strided full = layout_of("topk", t);
  cuda::Strided r;
  for (int k = 0; k < full.dim; ++k) {
    if (k == d) continue;
    r.sizes[r.dim] = full.sizes[k];
    r.strides[r.dim] = full.strides[k];
    ++r.dim;
  }
  return r;
}

// topk on CUDA: one warp per row reads x in place (any layout, its own dtype)
// and writes values (x's dtype, copied exactly) and i64 indices of `shape`.
std::pair<Tensor, Tensor> topk_cuda(const Tensor& x, std::int64_t k, std::int64_t d, bool largest,
                                    const Shape& shape) {
  if constexpr (kHaveCuda) {
    Tensor values = empty(shape, TensorOptions(x.dtype(), x.device()));
    Tensor indices = empty(shape, TensorOptions(DType::i64, x.device()));
    cuda::topk(x.raw_data(), x.dtype(), rows_layout(x, d), x.stride(d), x.size(d), values.raw_data(),
               indices.data<std::int64_t>(), rows_layout(values, d), values.stride(d), k, largest, cuda_stream());
    return {values, indices};
  } else {
    no_cuda_kernel("topk");
  }
}

// The gradient of topk's values on CUDA: g placed at the picked entries of a
// zero tensor of x's shape (0 + g, as the CPU's scatter_add into zeros).
Tensor topk_backward_cuda(const Shape& xs, std::int64_t d, DType dt, const Tensor& indices, const Tensor& g_in) {
  if constexpr (kHaveCuda) {
    const Tensor g = g_in.dtype() == dt ? g_in : g_in.to(dt);
    Tensor gx = empty(xs, TensorOptions(dt, g.device()));
    cuda::memset_async(gx.raw_data(), 0, gx.nbytes(), cuda_stream());
    cuda::topk_backward(gx.raw_data(), rows_layout(gx, d), gx.stride(d), g.raw_data(), rows_layout(g, d), g.stride(d),
                        indices.data<std::int64_t>(), rows_layout(indices, d), indices.stride(d), dt, g.size(d),
                        cuda_stream());
    return gx;
  } else {
    no_cuda_kernel("topk backward");
  }
}

}  // namespace

std::pair<Tensor, Tensor> topk(const Tensor& x, std::int64_t k, std::int64_t dim, bool largest) {
  check_floating("topk", x, "input");
  check_kernel_device("topk", x);
  REMAT_CHECK(x.dim() >= 1, ShapeError, "topk: input must have at least one dim, got ",
              describe(x));
  const std::int64_t d = wrap_dim(dim, x.dim(), "topk");
  const std::int64_t n = x.size(d);
  REMAT_CHECK(k >= 0 && k <= n, ShapeError, "topk: k = ", k, " is out of range for dim ", d,
              " of size ", n, " (input ", describe(x), "; expected 0 <= k <= ", n, ")");
  auto outs = dispatch("topk", {x}, [&] {
    // Rows of x along d, as a contiguous f32 [rows, n] matrix.
    Shape perm;
    for (std::int64_t i = 0; i < x.dim(); ++i)
      if (i != d) perm.push_back(i);
    perm.push_back(d);
    Shape shape = x.sizes();
    shape[std::size_t(d)] = k;
    Tensor values, indices;
    if (on_cuda(x)) {
      NoGradGuard ng;
      std::tie(values, indices) = topk_cuda(x.detach(), k, d, largest, shape);
    } else {
      values = empty(shape, DType::f32);
      indices = empty(shape, DType::i64);
      NoGradGuard ng;
      Tensor mat = f32_contiguous(x.detach().permute(perm));
      // Outputs in the same permuted layout, written through permuted views.
      Shape pshape;
      for (auto p : perm) pshape.push_back(shape[std::size_t(p)]);
      Tensor pv = empty(pshape, DType::f32), pi = empty(pshape, DType::i64);
      const std::int64_t rows = n == 0 ? 0 : mat.numel() / n;
      const float* pm = mat.data<float>();
      float* ov = pv.data<float>();
      std::int64_t* oi = pi.data<std::int64_t>();
      if (k > 0)
        parallel_rows(rows, n, [&](std::int64_t r0, std::int64_t r1) {
          std::vector<std::int64_t> order(static_cast<std::size_t>(n));
          for (std::int64_t r = r0; r < r1; ++r) {
            const float* row = pm + r * n;
            std::iota(order.begin(), order.end(), std::int64_t(0));
            auto before = [&](std::int64_t a, std::int64_t b) {
              return ranks_before(row[a], a, row[b], b, largest);
            };
            std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
            for (std::int64_t j = 0; j < k; ++j) {
              ov[r * k + j] = row[order[std::size_t(j)]];
              oi[r * k + j] = order[std::size_t(j)];
            }
          }
        });
      // Undo the permutation: out.permute(perm) has pshape; copy into it.
      detail::copy_cpu(values.permute(perm), pv);
      detail::copy_cpu(indices.permute(perm), pi);
      values = from_f32(values, x.dtype());
    }
    if (auto node = autograd::make_node("topk", {&x})) {
      node->save(indices, /*is_output=*/true);
      node->backward_fn = [xs = x.sizes(), d, dt = x.dtype()](Node& n, std::vector<Tensor>& g) {
        // Indices within a row are distinct: scatter_add places each g once.
        if (on_cuda(g[0])) return std::vector<Tensor>{topk_backward_cuda(xs, d, dt, n.saved(0), g[0])};
        return std::vector<Tensor>{scatter_add(zeros(xs, dt), d, n.saved(0), g[0])};
      };
      autograd::set_history(values, node);
    }
    return std::vector<Tensor>{values, indices};
  });
  return {outs[0], outs[1]};
}

}  // namespace remat
