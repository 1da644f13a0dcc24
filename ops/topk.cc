#include "ops/topk.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>

#include "ops/index.h"
#include "ops/kernel_util.h"
#include "ops/op.h"

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

// ---------------------------------------------------------------------------
// CPU kernels (f32)

std::vector<Tensor> forward_cpu(const Tensor& x, std::int64_t k, std::int64_t d, bool largest) {
  const std::int64_t n = x.size(d);
  // Rows of x along d, as a contiguous f32 [rows, n] matrix.
  Shape perm;
  for (std::int64_t i = 0; i < x.dim(); ++i)
    if (i != d) perm.push_back(i);
  perm.push_back(d);
  Shape shape = x.sizes();
  shape[std::size_t(d)] = k;
  Tensor values = empty(shape, DType::f32);
  Tensor indices = empty(shape, DType::i64);
  Tensor mat = f32_contiguous(x.detach().permute(perm));
  // Outputs in the same permuted layout, written through permuted views.
  Shape pshape;
  for (auto p : perm) pshape.push_back(shape[std::size_t(p)]);
  Tensor pv = empty(pshape, DType::f32), pi = empty(pshape, DType::i64);
  if (skip_compute(values)) return {values, indices};
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
        auto before = [&](std::int64_t a, std::int64_t b) { return ranks_before(row[a], a, row[b], b, largest); };
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
  return {values, indices};
}

// Indices within a row are distinct: scatter_add places each g once.
// g arrives staged to f32; the op's runner gives the gradient the input's dtype.
Tensor backward_cpu(const Tensor& g, const Tensor& indices, const Shape& xs, std::int64_t d, DType) {
  return scatter_add(zeros(xs, g.dtype()), d, indices, g);
}

const KernelRegistration<TopkKernels> kCpu(topk_kernels(), DeviceType::CPU, {forward_cpu, backward_cpu},
                                           KernelDTypes::f32);

// ---------------------------------------------------------------------------
// The op

struct TopkState {
  std::int64_t k = 0;
  std::int64_t dim = -1;  // as given; the forward wraps it
  bool largest = true;
};

void check(const OpDef& op, const std::vector<Tensor>& in, const TopkState& s) {
  const Tensor& x = in[0];
  check_floating(op.name(), x, "input");
  REMAT_CHECK(x.dim() >= 1, ShapeError, op.name(), ": input must have at least one dim, got ", describe(x));
  const std::int64_t d = wrap_dim(s.dim, x.dim(), op.name());
  const std::int64_t n = x.size(d);
  REMAT_CHECK(s.k >= 0 && s.k <= n, ShapeError, op.name(), ": k = ", s.k, " is out of range for dim ", d,
              " of size ", n, " (input ", describe(x), "; expected 0 <= k <= ", n, ")");
}

OpResults forward(const std::vector<Tensor>& in, TopkState& s) {
  s.dim = wrap_dim(s.dim, in[0].dim(), "topk");
  return {topk_kernels().run(in[0].device(), &TopkKernels::forward, in[0], s.k, s.dim, s.largest)};
}

std::vector<Tensor> backward(const OpBackward<TopkState>& b) {
  return {topk_kernels().run(b.grad().device(), &TopkKernels::backward, b.grad(), b.saved("indices"),
                             b.input(0).sizes, b.state().dim, b.input(0).dtype)};
}

OpCost cost(const std::vector<Tensor>& in, const TopkState&) {
  const double n = double(in[0].numel());
  return {0, n, n * double(element_size(in[0].dtype()))};
}

const Op<TopkState> kTopk({.name = "topk",
                           .inputs = {"x"},
                           .outputs = {{"values"}, {"indices", always(DType::i64), false}},
                           .saves = {{"indices", SaveFrom::output, 1}},
                           .summary = "the k best entries along a dim, best first (ties to the lower index)"},
                          {.check = check, .forward = forward, .backward = backward, .cost = cost},
                          &topk_kernels());

}  // namespace

KernelTable<TopkKernels>& topk_kernels() {
  static KernelTable<TopkKernels> t("topk");
  return t;
}

std::pair<Tensor, Tensor> topk(const Tensor& x, std::int64_t k, std::int64_t dim, bool largest) {
  std::vector<Tensor> outs = kTopk({x}, {k, dim, largest});
  return {outs[0], outs[1]};
}

}  // namespace remat
