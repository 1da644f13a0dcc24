#include "ops/reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cuda/reduce.h"
#include "ops/binary.h"
#include "ops/kernel_util.h"

namespace remat {

using namespace ops_detail;

namespace {

// Normalised, sorted, unique reduced dims.
std::vector<std::int64_t> reduced_dims(const char* op, const Tensor& x, const Shape& dims) {
  std::vector<std::int64_t> d;
  for (auto v : dims) d.push_back(wrap_dim(v, x.dim(), op));
  std::sort(d.begin(), d.end());
  REMAT_CHECK(std::adjacent_find(d.begin(), d.end()) == d.end(), ShapeError, op, ": dim repeated in ",
              shape_str(dims));
  // A 0-dim tensor accepts dim 0 / -1 (as a one-element vector would) and
  // has nothing to reduce over.
  if (x.dim() == 0) d.clear();
  return d;
}

// x permuted so the reduced dims come last, as a contiguous f32 [outer, inner]
// matrix; also returns the output shapes with and without keepdim.
struct Folded {
  Tensor mat;
  std::int64_t outer = 1, inner = 1;
  Shape out_shape, keep_shape;
};

// The output shapes of a reduction of x over rd, with and without keepdim.
void reduced_shapes(const Tensor& x, const std::vector<std::int64_t>& rd, Shape& out_shape,
                    Shape& keep_shape) {
  std::vector<bool> is_red(std::size_t(x.dim()), false);
  for (auto d : rd) is_red[std::size_t(d)] = true;
  for (std::int64_t d = 0; d < x.dim(); ++d) {
    keep_shape.push_back(is_red[std::size_t(d)] ? 1 : x.size(d));
    if (!is_red[std::size_t(d)]) out_shape.push_back(x.size(d));
  }
}

// For the CUDA kernels: t's layout split into the kept dims (in order) and the
// reduced dims rd (sorted), as cuda/reduce.h takes them.
void split_layout(const char* op, const Tensor& t, const std::vector<std::int64_t>& rd,
                  cuda::Strided& kept, cuda::Strided& reduced) {
  const cuda::Strided l = layout_of(op, t);
  std::vector<bool> is_red(std::size_t(l.dim), false);
  for (auto d : rd) is_red[std::size_t(d)] = true;
  kept.dim = reduced.dim = 0;
  for (int d = 0; d < l.dim; ++d) {
    cuda::Strided& s = is_red[std::size_t(d)] ? reduced : kept;
    s.sizes[s.dim] = l.sizes[d];
    s.strides[s.dim] = l.strides[d];
    ++s.dim;
  }
}

Folded fold(const char* op, const Tensor& x, const std::vector<std::int64_t>& rd) {
  Folded f;
  Shape perm;
  std::vector<bool> is_red(std::size_t(x.dim()), false);
  for (auto d : rd) is_red[std::size_t(d)] = true;
  for (std::int64_t d = 0; d < x.dim(); ++d) {
    if (is_red[std::size_t(d)]) {
      f.keep_shape.push_back(1);
      continue;
    }
    perm.push_back(d);
    f.out_shape.push_back(x.size(d));
    f.keep_shape.push_back(x.size(d));
    f.outer *= x.size(d);
  }
  for (auto d : rd) {
    perm.push_back(d);
    f.inner *= x.size(d);
  }
  check_cpu(op, x);
  NoGradGuard ng;
  f.mat = f32_contiguous(x.detach().permute(perm));
  return f;
}

// sum_kernel on CUDA: the result in x's dtype, straight from x's layout.
Tensor sum_cuda(const char* op, const Tensor& x, const std::vector<std::int64_t>& rd, bool keepdim,
                float scale) {
  if constexpr (kHaveCuda) {
    Shape out_shape, keep_shape;
    reduced_shapes(x, rd, out_shape, keep_shape);
    cuda::Strided kept, reduced;
    split_layout(op, x, rd, kept, reduced);
    Tensor out = empty(keepdim ? keep_shape : out_shape, TensorOptions(x.dtype(), x.device()));
    const std::int64_t ws = cuda::reduce_sum_workspace(kept, reduced);
    Tensor work = ws > 0 ? empty({ws}, TensorOptions(DType::f32, x.device())) : Tensor();
    cuda::reduce_sum(out.raw_data(), x.raw_data(), x.dtype(), kept, reduced, scale,
                     ws > 0 ? work.data<float>() : nullptr, cuda_stream());
    return out;
  } else {
    no_cuda_kernel(op);
  }
}

Tensor sum_kernel(const char* op, const Tensor& x, const std::vector<std::int64_t>& rd,
                  bool keepdim, float scale) {
  check_kernel_device(op, x);
  if constexpr (kHaveCuda) {
    if (on_cuda(x)) return sum_cuda(op, x, rd, keepdim, scale);
  }
  Folded f = fold(op, x, rd);
  Tensor out = empty(keepdim ? f.keep_shape : f.out_shape, DType::f32);
  const float* p = f.mat.data<float>();
  float* o = out.data<float>();
  const std::int64_t inner = f.inner;
  if (f.outer >= 8 || inner < 4096) {
    parallel_rows(f.outer, inner, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) o[r] = lane_sum(p + r * inner, inner) * scale;
    });
  } else {
    // Few long rows: fixed-size blocks summed in parallel, then combined in order.
    constexpr std::int64_t kBlock = 4096;
    const std::int64_t nb = (inner + kBlock - 1) / kBlock;
    std::vector<float> partial(std::size_t(f.outer * nb));
    parallel_for(0, f.outer * nb, 1, [&](std::int64_t k0, std::int64_t k1) {
      for (std::int64_t k = k0; k < k1; ++k) {
        const std::int64_t r = k / nb, b = k % nb;
        const std::int64_t len = std::min(kBlock, inner - b * kBlock);
        partial[std::size_t(k)] = lane_sum(p + r * inner + b * kBlock, len);
      }
    });
    for (std::int64_t r = 0; r < f.outer; ++r)
      o[r] = lane_sum(partial.data() + r * nb, nb) * scale;
  }
  return from_f32(out, x.dtype());
}

// Gradient of a sum/mean: g (reduced shape) broadcast back to x's shape.
Tensor expand_back(const Tensor& g, const Shape& keep_shape, const Shape& x_shape, double scale) {
  Tensor e = g.reshape(keep_shape).expand(x_shape);
  return scale != 1.0 ? mul(e, scale) : e.contiguous();
}

Tensor sum_impl(const char* name, const Tensor& x, const Shape& dims, bool keepdim, bool is_mean) {
  check_floating(name, x, "input");
  const auto rd = reduced_dims(name, x, dims);
  std::int64_t count = 1;
  for (auto d : rd) count *= x.size(d);
  const double scale = is_mean ? 1.0 / double(std::max<std::int64_t>(count, 1)) : 1.0;
  return dispatch1(name, {x}, [&] {
    Tensor out = sum_kernel(name, x, rd, keepdim, float(scale));
    if (auto node = autograd::make_node(name, {&x})) {
      Shape keep = x.sizes();
      for (auto d : rd) keep[std::size_t(d)] = 1;
      node->backward_fn = [keep, xs = x.sizes(), scale](Node&, std::vector<Tensor>& g) {
        return std::vector<Tensor>{expand_back(g[0], keep, xs, scale)};
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

Shape all_dims(const Tensor& x) {
  Shape d;
  for (std::int64_t i = 0; i < x.dim(); ++i) d.push_back(i);
  return d;
}

}  // namespace

Tensor sum(const Tensor& x, const Shape& dims, bool keepdim) {
  return sum_impl("sum", x, dims, keepdim, false);
}
Tensor sum(const Tensor& x) { return sum_impl("sum", x, all_dims(x), false, false); }
Tensor mean(const Tensor& x, const Shape& dims, bool keepdim) {
  return sum_impl("mean", x, dims, keepdim, true);
}
Tensor mean(const Tensor& x) { return sum_impl("mean", x, all_dims(x), false, true); }

std::pair<Tensor, Tensor> max(const Tensor& x, std::int64_t dim, bool keepdim) {
  check_floating("max", x, "input");
  const std::int64_t d = wrap_dim(dim, x.dim(), "max");
  REMAT_CHECK(x.dim() == 0 || x.size(d) > 0, ShapeError, "max: dim ", d, " of ",
              describe(x), " is empty");
  check_kernel_device("max", x);
  const std::vector<std::int64_t> rd =
      x.dim() == 0 ? std::vector<std::int64_t>{} : std::vector<std::int64_t>{d};
  auto outs = dispatch("max", {x}, [&] {
    Tensor out, index;
    if (on_cuda(x)) {
      if constexpr (kHaveCuda) {
        Shape out_shape, keep_shape;
        reduced_shapes(x, rd, out_shape, keep_shape);
        cuda::Strided kept, reduced;
        split_layout("max", x, rd, kept, reduced);
        out = empty(keepdim ? keep_shape : out_shape, TensorOptions(x.dtype(), x.device()));
        index = empty(keepdim ? keep_shape : out_shape, TensorOptions(DType::i64, x.device()));
        cuda::reduce_max(out.raw_data(), index.data<std::int64_t>(), x.raw_data(), x.dtype(), kept,
                         reduced.numel(), reduced.dim > 0 ? reduced.strides[0] : 0, cuda_stream());
      } else {
        no_cuda_kernel("max");
      }
    } else {
      Folded f = fold("max", x, rd);
      Tensor values = empty(keepdim ? f.keep_shape : f.out_shape, DType::f32);
      index = empty(keepdim ? f.keep_shape : f.out_shape, DType::i64);
      const float* p = f.mat.data<float>();
      float* v = values.data<float>();
      std::int64_t* ix = index.data<std::int64_t>();
      const std::int64_t inner = f.inner;
      parallel_rows(f.outer, inner, [&](std::int64_t r0, std::int64_t r1) {
        for (std::int64_t r = r0; r < r1; ++r) {
          const float* row = p + r * inner;
          std::int64_t best = 0;
          for (std::int64_t i = 1; i < inner; ++i)
            if (row[i] > row[best] || (std::isnan(row[i]) && !std::isnan(row[best]))) best = i;
          v[r] = row[best];
          ix[r] = best;
        }
      });
      out = from_f32(values, x.dtype());
    }
    if (auto node = autograd::make_node("max", {&x})) {
      node->save(index, true);
      node->backward_fn = [xs = x.sizes(), d, keepdim, dt = x.dtype(), rd](Node& n, std::vector<Tensor>& g) {
        Tensor idx = n.saved(0);
        if constexpr (kHaveCuda) {
          if (on_cuda(idx)) {
            // Zeros, then each output's gradient written at its argmax.
            Tensor gx = zeros(xs, TensorOptions(dt, idx.device()));
            Tensor gc = contiguous_detached(g[0].dtype() == dt ? g[0] : g[0].to(dt));
            Tensor ic = contiguous_detached(idx);
            cuda::Strided kept, reduced;
            split_layout("max", gx, rd, kept, reduced);
            cuda::reduce_max_backward(gx.raw_data(), kept, reduced.dim > 0 ? reduced.strides[0] : 0,
                                      gc.raw_data(), ic.data<std::int64_t>(), dt, cuda_stream());
            return std::vector<Tensor>{gx};
          }
        }
        Tensor gg = g[0];
        if (!keepdim && !xs.empty()) {
          idx = idx.unsqueeze(d);
          gg = gg.unsqueeze(d);
        }
        Tensor gx = zeros(xs, DType::f32);
        Tensor gf = f32_contiguous(gg);
        Tensor ic = idx.contiguous();
        // Scatter each reduced row's gradient to its argmax.
        Shape perm;
        for (std::int64_t k = 0; k < std::int64_t(xs.size()); ++k)
          if (k != d) perm.push_back(k);
        if (!xs.empty()) perm.push_back(d);
        Tensor gxp = xs.empty() ? gx : gx.permute(perm);  // view: writes land in gx
        const std::int64_t inner = xs.empty() ? 1 : xs[std::size_t(d)];
        const std::int64_t rows = gx.numel() / std::max<std::int64_t>(inner, 1);
        Tensor gsrc = xs.empty() ? gf : gf.permute(perm).contiguous();
        Tensor isrc = xs.empty() ? ic : ic.permute(perm).contiguous();
        const float* pg = gsrc.data<float>();
        const std::int64_t* pi = isrc.data<std::int64_t>();
        float* base = gx.data<float>();
        const Shape& st = gxp.strides();
        for (std::int64_t r = 0; r < rows; ++r) {
          // Offset of row r in gx through the permuted view.
          std::int64_t off = 0, rem = r;
          for (std::int64_t k = std::int64_t(perm.size()) - 2; k >= 0; --k) {
            const std::int64_t sz = gxp.size(k);
            off += (rem % sz) * st[std::size_t(k)];
            rem /= sz;
          }
          base[off + pi[r] * (xs.empty() ? 0 : st.back())] += pg[r];
        }
        return std::vector<Tensor>{from_f32(gx, dt)};
      };
      autograd::set_history(out, node);
    }
    return std::vector<Tensor>{out, index};
  });
  return {outs[0], outs[1]};
}

Tensor amax(const Tensor& x, std::int64_t dim, bool keepdim) { return max(x, dim, keepdim).first; }

}  // namespace remat
