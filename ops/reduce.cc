#include "ops/reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/binary.h"
#include "ops/kernel_util.h"
#include "ops/op.h"

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

Folded fold(const Tensor& x, const std::vector<std::int64_t>& rd) {
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
  f.mat = f32_contiguous(x.detach().permute(perm));
  return f;
}

// The CPU sum (f32): in f32 lanes, scaled.
Tensor sum_cpu(const Tensor& x, const std::vector<std::int64_t>& rd, bool keepdim, float scale) {
  Folded f = fold(x, rd);
  Tensor out = empty(keepdim ? f.keep_shape : f.out_shape, DType::f32);
  if (skip_compute(out)) return out;
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
  return out;
}

// Gradient of a sum/mean: g (reduced shape) broadcast back to x's shape.
Tensor expand_back(const Tensor& g, const Shape& keep_shape, const Shape& x_shape, double scale) {
  Tensor e = g.reshape(keep_shape).expand(x_shape);
  return scale != 1.0 ? mul(e, scale) : e.contiguous();
}

// The CPU max (f32 values, i64 first-occurrence indices) over rd (one dim or none).
std::vector<Tensor> max_cpu(const Tensor& x, const std::vector<std::int64_t>& rd, bool keepdim) {
  Folded f = fold(x, rd);
  Tensor values = empty(keepdim ? f.keep_shape : f.out_shape, DType::f32);
  Tensor index = empty(keepdim ? f.keep_shape : f.out_shape, DType::i64);
  if (skip_compute(values)) return {values, index};
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
  return {values, index};
}

// max's input gradient (f32): each reduced row's gradient at its argmax, zeros elsewhere.
Tensor max_backward_cpu(const Tensor& g, const Tensor& index, const Shape& xs, std::int64_t d, bool keepdim,
                        DType) {
  Tensor idx = index, gg = g;
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
  if (skip_compute(gx)) return gx;
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
  return gx;
}

const KernelRegistration<ReduceKernels> kCpu(reduce_kernels(), DeviceType::CPU,
                                             {sum_cpu, max_cpu, max_backward_cpu}, KernelDTypes::f32);

// ---------------------------------------------------------------------------
// The ops

Shape all_dims(const Tensor& x) {
  Shape d;
  for (std::int64_t i = 0; i < x.dim(); ++i) d.push_back(i);
  return d;
}

// sum and mean

struct SumState {
  Shape dims;            // as given
  bool keepdim = false;
  bool mean = false;
  std::vector<std::int64_t> rd = {};  // the reduced dims, set by the forward
  double scale = 1.0;            // 1 / count for mean, set by the forward
};

void check_sum(const OpDef& op, const std::vector<Tensor>& in, const SumState& s) {
  check_floating(op.name(), in[0], "input");
  reduced_dims(op.name(), in[0], s.dims);
}

OpResults sum_fwd(const std::vector<Tensor>& in, SumState& s) {
  const Tensor& x = in[0];
  s.rd = reduced_dims(s.mean ? "mean" : "sum", x, s.dims);
  std::int64_t count = 1;
  for (auto d : s.rd) count *= x.size(d);
  s.scale = s.mean ? 1.0 / double(std::max<std::int64_t>(count, 1)) : 1.0;
  return {{reduce_kernels().run(x.device(), &ReduceKernels::sum, x, s.rd, s.keepdim, float(s.scale))}};
}

// g (reduced shape) broadcast back to x's shape.
std::vector<Tensor> sum_backward(const OpBackward<SumState>& b) {
  Shape keep = b.input(0).sizes;
  for (auto d : b.state().rd) keep[std::size_t(d)] = 1;
  return {expand_back(b.grad(), keep, b.input(0).sizes, b.state().scale)};
}

OpCost sum_cost(const std::vector<Tensor>& in, const SumState&) {
  const double n = double(in[0].numel());
  return {0, n, n * double(element_size(in[0].dtype()))};
}

Op<SumState> define_sum(const char* name, const char* summary) {
  return Op<SumState>({.name = name, .inputs = {"x"}, .outputs = {{"out"}}, .summary = summary},
                      {.check = check_sum, .forward = sum_fwd, .backward = sum_backward, .cost = sum_cost},
                      &reduce_kernels());
}

const Op<SumState> kSum = define_sum("sum", "sum over dims, f32 lanes in a fixed order");
const Op<SumState> kMean = define_sum("mean", "mean over dims");

// max

struct MaxState {
  std::int64_t dim = 0;  // as given; the forward wraps it
  bool keepdim = false;
};

void check_max(const OpDef& op, const std::vector<Tensor>& in, const MaxState& s) {
  const Tensor& x = in[0];
  check_floating(op.name(), x, "input");
  const std::int64_t d = wrap_dim(s.dim, x.dim(), op.name());
  REMAT_CHECK(x.dim() == 0 || x.size(d) > 0, ShapeError, op.name(), ": dim ", d, " of ", describe(x), " is empty");
}

OpResults max_fwd(const std::vector<Tensor>& in, MaxState& s) {
  const Tensor& x = in[0];
  s.dim = wrap_dim(s.dim, x.dim(), "max");
  const std::vector<std::int64_t> rd = x.dim() == 0 ? std::vector<std::int64_t>{} : std::vector<std::int64_t>{s.dim};
  return {reduce_kernels().run(x.device(), &ReduceKernels::max, x, rd, s.keepdim)};
}

std::vector<Tensor> max_backward(const OpBackward<MaxState>& b) {
  return {reduce_kernels().run(b.grad().device(), &ReduceKernels::max_backward, b.grad(), b.saved("index"),
                               b.input(0).sizes, b.state().dim, b.state().keepdim, b.input(0).dtype)};
}

OpCost max_cost(const std::vector<Tensor>& in, const MaxState&) {
  const double n = double(in[0].numel());
  return {0, n, n * double(element_size(in[0].dtype()))};
}

const Op<MaxState> kMax({.name = "max",
                         .inputs = {"x"},
                         .outputs = {{"values"}, {"index", always(DType::i64), false}},
                         .saves = {{"index", SaveFrom::output, 1}},
                         .summary = "maximum over a dim and its first index; the gradient flows to that index"},
                        {.check = check_max, .forward = max_fwd, .backward = max_backward, .cost = max_cost},
                        &reduce_kernels());

}  // namespace

KernelTable<ReduceKernels>& reduce_kernels() {
  static KernelTable<ReduceKernels> t("reductions");
  return t;
}

Tensor sum(const Tensor& x, const Shape& dims, bool keepdim) { return kSum.call1({x}, {dims, keepdim, false}); }
Tensor sum(const Tensor& x) { return kSum.call1({x}, {all_dims(x), false, false}); }
Tensor mean(const Tensor& x, const Shape& dims, bool keepdim) { return kMean.call1({x}, {dims, keepdim, true}); }
Tensor mean(const Tensor& x) { return kMean.call1({x}, {all_dims(x), false, true}); }

std::pair<Tensor, Tensor> max(const Tensor& x, std::int64_t dim, bool keepdim) {
  std::vector<Tensor> outs = kMax({x}, {dim, keepdim});
  return {outs[0], outs[1]};
}

Tensor amax(const Tensor& x, std::int64_t dim, bool keepdim) { return max(x, dim, keepdim).first; }

}  // namespace remat
