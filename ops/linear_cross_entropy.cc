// linear_cross_entropy: its definition, on the matmul and cross_entropy
// kernels of the device (no kernels of its own; it lists matmul's devices).
#include "ops/linear_cross_entropy.h"

#include <algorithm>
#include <vector>

#include "ops/gemm.h"
#include "ops/kernel_util.h"
#include "ops/loss.h"
#include "ops/matmul.h"
#include "ops/op.h"

namespace remat {

using namespace ops_detail;

namespace {

struct LinearCrossEntropyState {
  std::int64_t chunk = 0;
  std::int64_t ignore_index = -100;
  std::int64_t count = 0;  // targets that count, set by the forward
};

// The products' operands in f32: the logits are f32 whatever h's dtype.
Tensor as_f32(const Tensor& t) { return t.dtype() == DType::f32 ? t.detach() : t.detach().to(DType::f32); }

// One chunk's rows: h2 [rows, d] (f32 or not) and its logits [n, V] f32.
struct Chunk {
  std::int64_t begin = 0, rows = 0;
  Tensor h;       // [n, d] f32
  Tensor logits;  // [n, V] f32
};

Chunk chunk_logits(const Tensor& h2, const Tensor& wf, std::int64_t begin, std::int64_t n) {
  Chunk c{begin, n, as_f32(h2.narrow(0, begin, n)), Tensor()};
  const std::int64_t v = wf.size(0), d = wf.size(1);
  c.logits = matmul_kernels().run(h2.device(), &MatmulKernels::product, c.h, wf.t(), Shape{n, v}, 1, n, v, d);
  return c;
}

void check(const OpDef& op, const std::vector<Tensor>& in, const LinearCrossEntropyState& s) {
  const Tensor &h = in[0], &w = in[1], &targets = in[2];
  check_floating(op.name(), h, "hidden states");
  check_same(op.name(), h, w);
  check_index(op.name(), targets, "targets");
  REMAT_CHECK(targets.device() == h.device(), DeviceError, op.name(), ": targets ", describe(targets),
              " and hidden states ", describe(h), " are on different devices");
  REMAT_CHECK(w.dim() == 2, ShapeError, op.name(), ": weight must be [vocab, d], got ", describe(w));
  REMAT_CHECK(h.dim() >= 1 && h.size(-1) == w.size(1), ShapeError, op.name(), ": hidden states ", describe(h),
              " do not match weight ", describe(w), " (expected last dim ", w.size(1), ")");
  const Shape lead(h.sizes().begin(), h.sizes().end() - 1);
  REMAT_CHECK(targets.sizes() == lead, ShapeError, op.name(), ": targets ", describe(targets),
              " do not match hidden states ", describe(h), " (expected targets of shape ", shape_str(lead), ")");
  REMAT_CHECK(s.chunk >= 1, ShapeError, op.name(), ": chunk must be at least 1 row, got ", s.chunk);
}

OpResults forward(const std::vector<Tensor>& in, LinearCrossEntropyState& s) {
  const Tensor &h = in[0], &w = in[1];
  const Device dev = h.device();
  const std::int64_t v = w.size(0), d = w.size(1);
  const Tensor h2 = h.detach().reshape({-1, d}), t1 = in[2].detach().reshape({-1});
  const std::int64_t rows = h2.size(0);
  std::vector<std::int64_t> tg;
  s.count = read_class_targets("linear_cross_entropy", t1, v, s.ignore_index, tg);
  const Tensor wf = as_f32(w);
  const TensorOptions f32(DType::f32, dev);
  Tensor lse = empty({rows}, f32), row_loss = empty({rows}, f32);
  for (std::int64_t r = 0; r < rows; r += s.chunk) {
    const std::int64_t n = std::min(s.chunk, rows - r);
    const Chunk c = chunk_logits(h2, wf, r, n);
    const std::vector<std::int64_t> host(tg.begin() + r, tg.begin() + r + n);
    const std::vector<Tensor> f = cross_entropy_kernels().run(dev, &CrossEntropyKernels::forward, c.logits,
                                                              t1.narrow(0, r, n), host, s.count, s.ignore_index);
    lse.narrow(0, r, n).copy_(f[1]);
    row_loss.narrow(0, r, n).copy_(f[2]);
  }
  // The row losses summed in row order, as cross_entropy sums them.
  const std::vector<float> host_loss = row_loss.to_vector<float>();
  return {{full({}, mean_of_row_losses(host_loss.data(), rows, s.count), f32)}, {lse}};
}

std::vector<Tensor> backward(const OpBackward<LinearCrossEntropyState>& b) {
  const LinearCrossEntropyState& s = b.state();
  const Tensor h = b.saved("h"), w = b.saved("w"), lse = b.saved("lse");
  const Device dev = h.device();
  const std::int64_t v = w.size(0), d = w.size(1);
  const Tensor h2 = h.detach().reshape({-1, d}), t1 = b.saved("targets").detach().reshape({-1});
  const std::int64_t rows = h2.size(0);
  const Tensor wf = as_f32(w);
  const MatmulKernels& mk = matmul_kernels().on(dev).fns;
  REMAT_CHECK(mk.accumulate != nullptr, DeviceError, "linear_cross_entropy: ", dev.str(),
              " has no accumulating matmul kernel for the weight's gradient");
  Tensor dh = b.needs(0) ? empty({rows, d}, TensorOptions(DType::f32, dev)) : Tensor();
  Tensor dw;
  for (std::int64_t r = 0; r < rows; r += s.chunk) {
    const std::int64_t n = std::min(s.chunk, rows - r);
    Chunk c = chunk_logits(h2, wf, r, n);
    const Tensor dl = cross_entropy_kernels().run(dev, &CrossEntropyKernels::backward, b.grad(), c.logits,
                                                  t1.narrow(0, r, n), lse.narrow(0, r, n), s.count, s.ignore_index);
    c.logits = Tensor();  // one chunk's logits and their gradient at a time
    if (dh.defined())
      dh.narrow(0, r, n).copy_(
          matmul_kernels().run(dev, &MatmulKernels::product, dl, wf, Shape{n, d}, 1, n, d, v));
    if (!b.needs(1)) continue;
    if (!dw.defined())
      dw = matmul_kernels().run(dev, &MatmulKernels::product, dl.t(), c.h, Shape{v, d}, 1, v, d, n);
    else
      matmul_kernels().run(dev, &MatmulKernels::accumulate, dw, dl.t(), c.h);
  }
  if (b.needs(1) && !dw.defined()) dw = zeros({v, d}, TensorOptions(DType::f32, dev));  // no rows
  return {dh.defined() ? dh.view(h.sizes()) : Tensor(), dw, Tensor()};
}

OpCost cost(const std::vector<Tensor>& in, const LinearCrossEntropyState&) {
  const Tensor &h = in[0], &w = in[1];
  const double d = double(w.size(1)), v = double(w.size(0)), rows = double(h.numel()) / std::max(d, 1.0);
  const double es = double(element_size(h.dtype()));
  return {2 * rows * v * d, 4 * rows * v, (double(h.numel()) + double(w.numel())) * es + rows * 8};
}

const Op<LinearCrossEntropyState> kLinearCrossEntropy(
    {.name = "linear_cross_entropy",
     .inputs = {"h", "w", "targets"},
     .outputs = {{"loss", always(DType::f32)}},
     .saves = {{"h", SaveFrom::input, 0},
               {"w", SaveFrom::input, 1},
               {"targets", SaveFrom::input, 2},
               {"lse", SaveFrom::intermediate, 0}},
     .summary = "cross_entropy(linear(h, w)) in chunks of rows, logits recomputed in backward"},
    {.check = check, .forward = forward, .backward = backward, .cost = cost}, &matmul_kernels());

}  // namespace

Tensor linear_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& targets, std::int64_t chunk,
                            std::int64_t ignore_index) {
  return kLinearCrossEntropy.call1({h, w, targets}, {chunk, ignore_index, 0});
}

std::int64_t loss_chunk_tile(Device device) {
  if (!device.is_cpu()) return 1;
  return std::max<std::int64_t>(gemm_reduction_block(), 1);
}

}  // namespace remat
