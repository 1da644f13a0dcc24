#include "ops/join.h"

#include <cstring>

#include "ops/kernel_util.h"
#include "ops/op.h"

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
  }
}

// The CPU kernel: contiguous inputs as one memcpy per (outer row, input),
// the rest through the strided copy.
Tensor cat_cpu(const std::vector<Tensor>& xs, std::int64_t d, const Shape& shape) {
  Tensor out = empty(shape, TensorOptions(xs[0].dtype(), xs[0].device()));
  if (out.numel() == 0 || skip_compute(out)) return out;
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

const KernelRegistration<CatKernels> kCpu(cat_kernels(), DeviceType::CPU, {cat_cpu}, KernelDTypes::native);

// ---------------------------------------------------------------------------
// cat

struct CatState {
  std::int64_t dim = 0;  // as given; the forward wraps it
};

// The shape of the result; throws ShapeError naming the first mismatch.
Shape cat_shape(const char* op, const std::vector<Tensor>& xs, std::int64_t d) {
  const Tensor& x0 = xs[0];
  Shape shape = x0.sizes();
  shape[std::size_t(d)] = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    bool ok = xs[i].dim() == x0.dim();
    for (std::int64_t k = 0; ok && k < x0.dim(); ++k) ok = k == d || xs[i].size(k) == x0.size(k);
    REMAT_CHECK(ok, ShapeError, op, ": tensor ", i, " has shape ", shape_str(xs[i].sizes()), " but tensor 0 has shape ",
                shape_str(x0.sizes()), "; sizes must match except in dim ", d);
    shape[std::size_t(d)] += xs[i].size(d);
  }
  return shape;
}

void check_cat(const OpDef& op, const std::vector<Tensor>& xs, const CatState& s) {
  check_list(op.name(), xs);
  REMAT_CHECK(xs[0].dim() >= 1, ShapeError, op.name(), ": tensors must have at least one dim, got ", describe(xs[0]),
              " (use stack to join scalars)");
  cat_shape(op.name(), xs, wrap_dim(s.dim, xs[0].dim(), op.name()));
}

OpResults cat_fwd(const std::vector<Tensor>& xs, CatState& s) {
  s.dim = wrap_dim(s.dim, xs[0].dim(), "cat");
  return {{cat_kernels().run(xs[0].device(), &CatKernels::cat, xs, s.dim, cat_shape("cat", xs, s.dim))}};
}

// Each input's gradient is its slice of g.
std::vector<Tensor> cat_backward(const OpBackward<CatState>& b) {
  const std::int64_t d = b.state().dim;
  std::vector<Tensor> grads;
  std::int64_t off = 0;
  for (std::size_t i = 0; i < b.num_inputs(); ++i) {
    const std::int64_t len = b.input(i).sizes[std::size_t(d)];
    grads.push_back(b.needs(i) ? b.grad().narrow(d, off, len) : Tensor());
    off += len;
  }
  return grads;
}

OpCost cat_cost(const std::vector<Tensor>& xs, const CatState&) {
  double n = 0;
  for (const Tensor& x : xs) n += double(x.numel());
  return {0, 0, 2 * n * double(element_size(xs[0].dtype()))};
}

const Op<CatState> kCat({.name = "cat",
                         .inputs = {"tensors"},
                         .variadic = true,
                         .outputs = {{"out", as_computed()}},
                         .summary = "concatenation along a dim (any dtype)"},
                        {.check = check_cat, .forward = cat_fwd, .backward = cat_backward, .cost = cat_cost},
                        &cat_kernels());

// ---------------------------------------------------------------------------
// split: views (narrow), differentiable as views are

struct SplitState {
  std::vector<std::int64_t> sizes;
  std::int64_t dim = 0;  // wrapped
};

OpResults split_fwd(const std::vector<Tensor>& in, SplitState& s) {
  std::vector<Tensor> out;
  std::int64_t off = 0;
  for (auto n : s.sizes) {
    out.push_back(in[0].narrow(s.dim, off, n));
    off += n;
  }
  return {out};
}

const Op<SplitState> kSplit({.name = "split",
                             .inputs = {"x"},
                             .outputs = {{"parts", as_computed()}},
                             .variadic_outputs = true,
                             .autograd = OpAutograd::inner,
                             .summary = "views of consecutive slices along a dim"},
                            {.forward = split_fwd});

std::vector<Tensor> split_impl(const Tensor& x, const std::vector<std::int64_t>& sizes, std::int64_t d) {
  return kSplit({x}, {sizes, d});
}

}  // namespace

KernelTable<CatKernels>& cat_kernels() {
  static KernelTable<CatKernels> t("cat");
  return t;
}

Tensor cat(const std::vector<Tensor>& xs, std::int64_t dim) { return kCat.call1(xs, {dim}); }
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
