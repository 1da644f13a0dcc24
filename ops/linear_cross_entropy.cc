// linear_cross_entropy: its definition, on the matmul and cross_entropy
// kernels of the device (no kernels of its own; it lists matmul's devices).
#include "ops/linear_cross_entropy.h"

#include <algorithm>
#include <vector>

#include "engine/allocator.h"
#include "ops/binary.h"
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
  bool grad_h = false, grad_w = false;  // the gradients the forward computes (a node will need them)
  std::int64_t count = 0;               // targets that count, set by the forward
};

// The products' operands in f32: the logits are f32 whatever h's dtype.
Tensor as_f32(const Tensor& t) { return t.dtype() == DType::f32 ? t.detach() : t.detach().to(DType::f32); }

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

// The gradients of the mean loss (an upstream gradient of 1), built chunk by
// chunk in the forward: dh's rows and dw, accumulated over k (the rows) in
// the GEMM itself.
struct UnitGrads {
  Tensor dh, dw;  // f32 [rows, d] and [V, d], undefined where not wanted
  void add_chunk(const Tensor& dl, const Tensor& hc, const Tensor& wf, std::int64_t r) {
    const Device dev = hc.device();
    const std::int64_t n = hc.size(0), v = wf.size(0), d = wf.size(1);
    CategoryScope cat(MemoryCategory::gradient);  // they become the inputs' gradients
    if (dh.defined())
      dh.narrow(0, r, n).copy_(matmul_kernels().run(dev, &MatmulKernels::product, dl, wf, Shape{n, d}, 1, n, d, v));
    if (!want_dw) return;
    if (!dw.defined())
      dw = matmul_kernels().run(dev, &MatmulKernels::product, dl.t(), hc, Shape{v, d}, 1, v, d, n);
    else
      matmul_kernels().run(dev, &MatmulKernels::accumulate, dw, dl.t(), hc);
  }
  bool want_dw = false;
};

// Chunk by chunk: the logits (f32), their log-sum-exp and row losses, and
// when a node will need them the gradients (dl = (softmax - onehot) / count,
// then dl w and dl^T h); the chunk's logits and dl go before the next.
OpResults forward(const std::vector<Tensor>& in, LinearCrossEntropyState& s) {
  const Tensor &h = in[0], &w = in[1];
  const Device dev = h.device();
  const std::int64_t v = w.size(0), d = w.size(1);
  const Tensor h2 = h.detach().reshape({-1, d}), t1 = in[2].detach().reshape({-1});
  const std::int64_t rows = h2.size(0);
  std::vector<std::int64_t> tg;
  s.count = read_class_targets("linear_cross_entropy", t1, v, s.ignore_index, tg);
  REMAT_CHECK(!s.grad_w || matmul_kernels().on(dev).fns.accumulate != nullptr, DeviceError,
              "linear_cross_entropy: ", dev.str(), " has no accumulating matmul kernel for the weight's gradient");
  const Tensor wf = as_f32(w), wt = wf.t();
  const TensorOptions f32(DType::f32, dev);
  const Tensor one = full({}, 1.0, f32);
  Tensor row_loss = empty({rows}, f32);
  UnitGrads g;
  g.want_dw = s.grad_w;
  if (s.grad_h) {
    CategoryScope cat(MemoryCategory::gradient);
    g.dh = empty({rows, d}, f32);
  }
  for (std::int64_t r = 0; r < rows; r += s.chunk) {
    const std::int64_t n = std::min(s.chunk, rows - r);
    const Tensor hc = as_f32(h2.narrow(0, r, n)), tc = t1.narrow(0, r, n);
    Tensor logits = matmul_kernels().run(dev, &MatmulKernels::product, hc, wt, Shape{n, v}, 1, n, v, d);
    const std::vector<std::int64_t> host(tg.begin() + r, tg.begin() + r + n);
    const std::vector<Tensor> f =
        cross_entropy_kernels().run(dev, &CrossEntropyKernels::forward, logits, tc, host, s.count, s.ignore_index);
    row_loss.narrow(0, r, n).copy_(f[2]);
    if (!s.grad_h && !s.grad_w) continue;
    Tensor dl = cross_entropy_kernels().run(dev, &CrossEntropyKernels::backward, one, logits, tc, f[1], s.count,
                                            s.ignore_index);
    logits = Tensor();  // one chunk's logits and their gradient at a time
    g.add_chunk(dl, hc, wf, r);
  }
  if (s.grad_w && !g.dw.defined()) g.dw = zeros({v, d}, f32);  // no rows
  // The row losses summed in row order, as cross_entropy sums them.
  Tensor loss;
  if (dev.is_meta()) {  // meta: shapes only
    mirror_host_read(row_loss, DType::f32);
    loss = full({}, 0.0, f32);
  } else {
    const std::vector<float> host_loss = row_loss.to_vector<float>();
    loss = full({}, mean_of_row_losses(host_loss.data(), rows, s.count), f32);
  }
  return {{loss}, {g.dh.defined() ? g.dh.view(h.sizes()) : Tensor(), g.dw}};
}

// The forward's gradients times the upstream gradient (as they are when it
// is 1, the loss's own seed: the unchunked pair's bits; a power of two, as
// a loss scale is, keeps them too).
std::vector<Tensor> backward(const OpBackward<LinearCrossEntropyState>& b) {
  const Tensor& g = b.grad();
  // meta has no values: its upstream gradient counts as the loss's own seed, 1
  const Tensor g32 = g.detach().to(DType::f32);
  const bool unit = g.device().is_meta() || g32.item() == 1.0;
  auto scaled = [&](const char* name) {
    const Tensor t = b.saved(name);
    return unit ? t : mul(t, g.detach().to(DType::f32));
  };
  return {b.needs(0) ? scaled("dh") : Tensor(), b.needs(1) ? scaled("dw") : Tensor(), Tensor()};
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
     .saves = {{"dh", SaveFrom::intermediate, 0, inputs_mask({0})}, {"dw", SaveFrom::intermediate, 1, inputs_mask({1})}},
     .summary = "cross_entropy(linear(h, w)) in chunks of rows; its gradients made in the forward"},
    {.check = check, .forward = forward, .backward = backward, .cost = cost}, &matmul_kernels());

}  // namespace

Tensor linear_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& targets, std::int64_t chunk,
                            std::int64_t ignore_index) {
  // The gradients a node will need (the op records one when grad mode is on
  // and an input requires grad), computed with the logits in the forward.
  const bool rec = grad_enabled();
  return kLinearCrossEntropy.call1({h, w, targets},
                                   {chunk, ignore_index, rec && h.requires_grad(), rec && w.requires_grad(), 0});
}

std::int64_t loss_chunk_tile(Device device) {
  if (!device.is_cpu() && !device.is_meta()) return 1;  // meta runs the CPU's kernels
  return std::max<std::int64_t>(gemm_reduction_block(), 1);
}

}  // namespace remat
