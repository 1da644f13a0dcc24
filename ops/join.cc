#include "ops/join.h"

#include <cstring>

#include "cuda/copy.h"
#include "ops/kernel_util.h"

namespace remat {

using namespace ops_detail;

namespace {

// Throws unless every tensor of `xs` is defined and shares xs[0]'s dtype and
// device (`op` names the public op in messages).
void check_list(const char* op, const std::vector<Tensor>& xs) {
  REMAT_CHECK(!xs.empty(), ShapeError, op, ": expected at least one tensor, got an empty list");
  for (std::size_t i = 0; i < xs.size(); ++i) {
    REMAT_CHECK(xs[i].defined(), Error, op, ": tensor ", i, " is an undefined tensor");
    REMAT_CHECK(xs[i].dtype() == xs[0].dtype(), DTypeError, op, ": tensor ", i, " is ",
                describe(xs[i]), " but tensor 0 is ", describe(xs[0]),
                "; all tensors must share one dtype (cast with .to(dtype))");
    REMAT_CHECK(xs[i].device() == xs[0].device(), DeviceError, op, ": tensor ", i, " is ",
                describe(xs[i]), " but tensor 0 is ", describe(xs[0]),
                "; all tensors must be on one device");
    check_kernel_device(op, xs[i]);
  }
}

// The concatenation of `xs` along `d` (shapes already checked), copied as raw
// elements of any dtype.
Tensor cat_kernel(const std::vector<Tensor>& xs, std::int64_t d, const Shape& shape) {
  NoGradGuard ng;
  Tensor out = empty(shape, TensorOptions(xs[0].dtype(), xs[0].device()));
  if (out.numel() == 0) return out;
  if constexpr (kHaveCuda) {
    if (on_cuda(out)) {
      // Each input is copied into its narrowed view of the output (any layout).
      std::int64_t off = 0;
      for (const auto& x : xs) {
        const std::int64_t len = x.size(d);
        if (len > 0) {
          const Tensor dst = out.narrow(d, off, len);
          cuda::copy_strided(dst.raw_data(), dst.dtype(), layout_of("cat", dst), x.raw_data(), x.dtype(),
                             layout_of("cat", x), cuda_stream());
        }
        off += len;
      }
      return out;
    }
  }
  std::int64_t outer = 1, inner = 1;
  for (std::int64_t k = 0; k < d; ++k) outer *= shape[std::size_t(k)];
  for (std::int64_t k = d + 1; k < std::int64_t(shape.size()); ++k) inner *= shape[std::size_t(k)];
  const std::int64_t total = shape[std::size_t(d)];
  const std::size_t es = element_size(out.dtype());
  // Contiguous inputs: one memcpy per (outer row, input); the rest go through
  // the generic strided copy.
  std::vector<std::int64_t> offsets;
  std::vector<std::size_t> contiguous_inputs;
  std::int64_t off = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::int64_t len = xs[i].size(d);
    offsets.push_back(off);
    if (len > 0) {
      if (xs[i].is_contiguous())
        contiguous_inputs.push_back(i);
      else
        detail::copy_cpu(out.narrow(d, off, len), xs[i].detach());
    }
    off += len;
  }
  if (contiguous_inputs.empty()) return out;
  char* po = static_cast<char*>(out.raw_data());
  parallel_rows(outer, total * inner, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r)
      for (std::size_t i : contiguous_inputs) {
        const std::int64_t chunk = xs[i].size(d) * inner;
        std::memcpy(po + std::size_t((r * total + offsets[i]) * inner) * es,
                    static_cast<const char*>(xs[i].raw_data()) + std::size_t(r * chunk) * es,
                    std::size_t(chunk) * es);
      }
  });
  return out;
}

std::vector<Tensor> split_impl(const Tensor& x, const std::vector<std::int64_t>& sizes,
                               std::int64_t d) {
  return dispatch("split", {x}, [&] {
    std::vector<Tensor> out;
    std::int64_t off = 0;
    for (auto s : sizes) {
      out.push_back(x.narrow(d, off, s));
      off += s;
    }
    return out;
  });
}

}  // namespace

Tensor cat(const std::vector<Tensor>& xs, std::int64_t dim) {
  check_list("cat", xs);
  const Tensor& x0 = xs[0];
  REMAT_CHECK(x0.dim() >= 1, ShapeError, "cat: tensors must have at least one dim, got ",
              describe(x0), " (use stack to join scalars)");
  const std::int64_t d = wrap_dim(dim, x0.dim(), "cat");
  Shape shape = x0.sizes();
  shape[std::size_t(d)] = 0;
  std::vector<std::int64_t> lens;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    bool ok = xs[i].dim() == x0.dim();
    for (std::int64_t k = 0; ok && k < x0.dim(); ++k)
      ok = k == d || xs[i].size(k) == x0.size(k);
    REMAT_CHECK(ok, ShapeError, "cat: tensor ", i, " has shape ", shape_str(xs[i].sizes()),
                " but tensor 0 has shape ", shape_str(x0.sizes()),
                "; sizes must match except in dim ", d);
    lens.push_back(xs[i].size(d));
    shape[std::size_t(d)] += xs[i].size(d);
  }
  return dispatch1("cat", xs, [&] {
    Tensor out = cat_kernel(xs, d, shape);
    std::vector<const Tensor*> inputs;
    for (const auto& x : xs) inputs.push_back(&x);
    if (auto node = autograd::make_node("cat", inputs)) {
      // Each input's gradient is its slice of g: only the sizes are needed.
      node->backward_fn = [d, lens](Node& n, std::vector<Tensor>& g) {
        std::vector<Tensor> grads;
        std::int64_t off = 0;
        for (std::size_t i = 0; i < lens.size(); ++i) {
          grads.push_back(n.needs_input_grad(i) ? g[0].narrow(d, off, lens[i]) : Tensor());
          off += lens[i];
        }
        return grads;
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

std::vector<Tensor> split(const Tensor& x, std::int64_t split_size, std::int64_t dim) {
  check_defined("split", x, "input");
  REMAT_CHECK(x.dim() >= 1, ShapeError, "split: cannot split a 0-dim tensor (", describe(x), ")");
  const std::int64_t d = wrap_dim(dim, x.dim(), "split");
  const std::int64_t n = x.size(d);
  REMAT_CHECK(split_size > 0 || (split_size == 0 && n == 0), ShapeError,
              "split: split_size must be positive, got ", split_size, " for dim ", d, " of ",
              describe(x));
  std::vector<std::int64_t> sizes;
  if (n == 0) sizes.push_back(0);
  for (std::int64_t off = 0; off < n; off += split_size)
    sizes.push_back(std::min(split_size, n - off));
  return split_impl(x, sizes, d);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<std::int64_t>& sizes,
                          std::int64_t dim) {
  check_defined("split", x, "input");
  REMAT_CHECK(x.dim() >= 1, ShapeError, "split: cannot split a 0-dim tensor (", describe(x), ")");
  const std::int64_t d = wrap_dim(dim, x.dim(), "split");
  std::int64_t total = 0;
  bool nonneg = true;
  for (auto s : sizes) {
    nonneg = nonneg && s >= 0;
    total += s;
  }
  REMAT_CHECK(nonneg && total == x.size(d), ShapeError, "split: sizes ", shape_str(sizes),
              " must be >= 0 and sum to ", x.size(d), " (dim ", d, " of ", describe(x), ")");
  return split_impl(x, sizes, d);
}

Tensor stack(const std::vector<Tensor>& xs, std::int64_t dim) {
  check_list("stack", xs);
  for (std::size_t i = 0; i < xs.size(); ++i)
    REMAT_CHECK(xs[i].sizes() == xs[0].sizes(), ShapeError, "stack: tensor ", i, " has shape ",
                shape_str(xs[i].sizes()), " but tensor 0 has shape ", shape_str(xs[0].sizes()),
                "; all tensors must have the same shape");
  const std::int64_t d = wrap_dim(dim, xs[0].dim() + 1, "stack");
  std::vector<Tensor> us;
  us.reserve(xs.size());
  for (const auto& x : xs) us.push_back(x.unsqueeze(d));
  return cat(us, d);
}

}  // namespace remat
