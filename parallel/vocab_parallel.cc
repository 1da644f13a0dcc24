// vocab_parallel_embedding (composed of ops) and the definition of
// vocab_parallel_cross_entropy, on the matmul kernels and host loops for the
// softmax rows (each row in a fixed order: the same bits on any thread count).
#include "parallel/vocab_parallel.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/allocator.h"
#include "ops/binary.h"
#include "ops/cast.h"
#include "ops/embedding.h"
#include "ops/kernel_util.h"
#include "ops/matmul.h"
#include "ops/op.h"

namespace remat {

using namespace ops_detail;

Tensor vocab_parallel_embedding(const Tensor& table, const Tensor& ids, std::int64_t vocab_begin) {
  REMAT_CHECK(table.dim() == 2, ShapeError, "vocab_parallel_embedding: table must be [rows, d], got ",
              shape_str(table.sizes()));
  REMAT_CHECK(ids.dtype() == DType::i64, DTypeError, "vocab_parallel_embedding: ids must be i64, got ", ids.dtype());
  const std::int64_t rows = table.size(0);
  Shape mask_shape = ids.sizes();
  mask_shape.push_back(1);
  if (ids.device().is_meta()) {  // (shapes only: the same ops on tensors without values)
    const Tensor found = embedding(table, empty(ids.sizes(), TensorOptions(DType::i64, ids.device())));
    return mul(found, empty(mask_shape, TensorOptions(found.dtype(), ids.device())));
  }
  const std::vector<std::int64_t> all = ids.contiguous().to_vector<std::int64_t>();
  std::vector<std::int64_t> local(all.size());
  std::vector<float> keep(all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    const bool mine = all[i] >= vocab_begin && all[i] < vocab_begin + rows;
    local[i] = mine ? all[i] - vocab_begin : 0;
    keep[i] = mine ? 1.0f : 0.0f;
  }
  const Tensor found = embedding(table, from_vector<std::int64_t>(local, ids.sizes(), ids.device()));
  Tensor mask = from_vector<float>(keep, mask_shape, ids.device());
  return mul(found, mask.dtype() == found.dtype() ? mask : cast(mask, found.dtype()));
}

namespace {

struct VocabCEState {
  std::shared_ptr<ProcessGroup> group;
  std::int64_t vocab_begin = 0, vocab = 0, chunk = 0, ignore_index = -100;
  bool grad_h = false, grad_w = false;
};

Tensor as_f32(const Tensor& t) { return t.dtype() == DType::f32 ? t.detach() : t.detach().to(DType::f32); }

void check(const OpDef& op, const std::vector<Tensor>& in, const VocabCEState& s) {
  const Tensor &h = in[0], &w = in[1], &targets = in[2];
  check_floating(op.name(), h, "hidden states");
  check_same(op.name(), h, w);
  check_index(op.name(), targets, "targets");
  REMAT_CHECK(h.device().is_cpu() || h.device().is_meta(), DeviceError, op.name(),
              ": runs on the CPU (tensor parallelism under MPI) or meta, got ", describe(h));
  REMAT_CHECK(w.dim() == 2 && h.dim() >= 1 && h.size(-1) == w.size(1), ShapeError, op.name(), ": hidden states ",
              describe(h), " do not match the weight's rows ", describe(w), " (expected [..., d] and [rows, d])");
  const Shape lead(h.sizes().begin(), h.sizes().end() - 1);
  REMAT_CHECK(targets.sizes() == lead, ShapeError, op.name(), ": targets ", describe(targets),
              " do not match hidden states ", describe(h), " (expected ", shape_str(lead), ")");
  REMAT_CHECK(s.chunk >= 1 && s.vocab_begin >= 0 && s.vocab_begin + w.size(0) <= s.vocab, ShapeError, op.name(),
              ": rows [", s.vocab_begin, ", ", s.vocab_begin + w.size(0), ") of a vocabulary of ", s.vocab,
              " in chunks of ", s.chunk, " (expected rows inside the vocabulary and chunk >= 1)");
}

// One chunk's rows: the logits' row maxima over the group, then the sums of
// exp and the target logits over the group; the row losses and, with
// `dl`, (softmax - onehot) / count in place of the logits.
void chunk_rows(ProcessGroup& g, Tensor& logits, const std::int64_t* tg, std::int64_t v0, std::int64_t count,
                std::int64_t ignore, float* row_loss, bool dl) {
  const std::int64_t n = logits.size(0), vr = logits.size(1);
  if (logits.device().is_meta()) {  // shapes only: the two all-reduces, counted
    const TensorOptions meta(DType::f32, logits.device());
    Tensor mx = empty({n}, meta), sums = empty({2 * n}, meta);
    g.all_reduce(mx, ReduceOp::max);
    g.all_reduce(sums, ReduceOp::sum);
    return;
  }
  float* l = logits.data<float>();
  Tensor mx = empty({n}, DType::f32);
  float* m = mx.data<float>();
  for (std::int64_t i = 0; i < n; ++i) m[i] = *std::max_element(l + i * vr, l + (i + 1) * vr);
  g.all_reduce(mx, ReduceOp::max);
  Tensor sums = empty({2 * n}, DType::f32);  // sum of exp, then the target logit (0 off this rank)
  float* se = sums.data<float>();
  parallel_for(0, n, 16, [&](std::int64_t a, std::int64_t b) {
    for (std::int64_t i = a; i < b; ++i) {
      double s = 0;
      for (std::int64_t j = 0; j < vr; ++j) s += std::exp(double(l[i * vr + j]) - double(m[i]));
      se[i] = float(s);
      const std::int64_t t = tg[i] - v0;
      se[n + i] = tg[i] != ignore && t >= 0 && t < vr ? l[i * vr + t] : 0.0f;
    }
  });
  g.all_reduce(sums, ReduceOp::sum);
  parallel_for(0, n, 16, [&](std::int64_t a, std::int64_t b) {
    for (std::int64_t i = a; i < b; ++i) {
      const bool counted = tg[i] != ignore;
      row_loss[i] = counted ? float(std::log(double(se[i])) + double(m[i]) - double(se[n + i])) : 0.0f;
      if (!dl) continue;
      float* row = l + i * vr;
      if (!counted) {
        std::fill(row, row + vr, 0.0f);
        continue;
      }
      const double scale = 1.0 / (double(se[i]) * double(count));
      for (std::int64_t j = 0; j < vr; ++j) row[j] = float(std::exp(double(row[j]) - double(m[i])) * scale);
      const std::int64_t t = tg[i] - v0;
      if (t >= 0 && t < vr) row[t] = float(double(row[t]) - 1.0 / double(count));
    }
  });
}

OpResults forward(const std::vector<Tensor>& in, VocabCEState& s) {
  const Tensor &h = in[0], &w = in[1];
  const Device dev = h.device();
  const std::int64_t vr = w.size(0), d = w.size(1);
  const Tensor h2 = h.detach().reshape({-1, d}), t1 = in[2].detach().reshape({-1});
  const std::int64_t rows = h2.size(0);
  std::vector<std::int64_t> tg;
  const std::int64_t count = read_class_targets("vocab_parallel_cross_entropy", t1, s.vocab, s.ignore_index, tg);
  const Tensor wf = as_f32(w), wt = wf.t();
  std::vector<float> row_loss(std::size_t(rows), 0.0f);
  Tensor dh, dw;
  if (s.grad_h) {
    CategoryScope cat(MemoryCategory::gradient);
    dh = empty({rows, d}, TensorOptions(DType::f32, dev));
  }
  for (std::int64_t r = 0; r < rows; r += s.chunk) {
    const std::int64_t n = std::min(s.chunk, rows - r);
    const Tensor hc = as_f32(h2.narrow(0, r, n)).contiguous();
    Tensor logits = matmul_kernels().run(dev, &MatmulKernels::product, hc, wt, Shape{n, vr}, 1, n, vr, d);
    const bool grads = s.grad_h || s.grad_w;
    chunk_rows(*s.group, logits, tg.data() + r, s.vocab_begin, count, s.ignore_index, row_loss.data() + r, grads);
    if (!grads) continue;
    CategoryScope cat(MemoryCategory::gradient);
    if (s.grad_h) dh.narrow(0, r, n).copy_(matmul_kernels().run(dev, &MatmulKernels::product, logits, wf,
                                                                 Shape{n, d}, 1, n, d, vr));
    if (!s.grad_w) continue;
    if (!dw.defined())
      dw = matmul_kernels().run(dev, &MatmulKernels::product, logits.t(), hc, Shape{vr, d}, 1, vr, d, n);
    else
      matmul_kernels().run(dev, &MatmulKernels::accumulate, dw, logits.t(), hc);
  }
  if (s.grad_w && !dw.defined()) dw = zeros({vr, d}, TensorOptions(DType::f32, dev));
  const Tensor loss = dev.is_meta() ? full({}, 0.0, TensorOptions(DType::f32, dev))  // (meta: no values)
                                    : full({}, mean_of_row_losses(row_loss.data(), rows, count), DType::f32);
  return {{loss}, {dh.defined() ? dh.view(h.sizes()) : Tensor(), dw}};
}

// The forward's gradients times the upstream gradient (1: as made).
std::vector<Tensor> backward(const OpBackward<VocabCEState>& b) {
  const Tensor g32 = b.grad().detach().to(DType::f32);
  const bool unit = g32.device().is_meta() || g32.item() == 1.0;  // (meta: the loss's own seed, as no values)
  auto scaled = [&](const char* name) {
    const Tensor t = b.saved(name);
    return unit ? t : mul(t, g32);
  };
  return {b.needs(0) ? scaled("dh") : Tensor(), b.needs(1) ? scaled("dw") : Tensor(), Tensor()};
}

OpCost cost(const std::vector<Tensor>& in, const VocabCEState&) {
  const Tensor &h = in[0], &w = in[1];
  const double d = double(w.size(1)), v = double(w.size(0)), rows = double(h.numel()) / std::max(d, 1.0);
  return {6 * rows * v * d, 6 * rows * v, (double(h.numel()) + double(w.numel())) * double(element_size(h.dtype()))};
}

const Op<VocabCEState> kVocabParallelCE(
    {.name = "vocab_parallel_cross_entropy",
     .inputs = {"h", "w", "targets"},
     .outputs = {{"loss", always(DType::f32)}},
     .saves = {{"dh", SaveFrom::intermediate, 0, inputs_mask({0})}, {"dw", SaveFrom::intermediate, 1, inputs_mask({1})}},
     .collective = true,
     .summary = "cross_entropy(linear(h, w)) over a vocabulary split across a tensor-parallel group"},
    {.check = check, .forward = forward, .backward = backward, .cost = cost});

}  // namespace

Tensor vocab_parallel_cross_entropy(const std::shared_ptr<ProcessGroup>& group, const Tensor& h, const Tensor& w,
                                    const Tensor& targets, std::int64_t vocab_begin, std::int64_t vocab,
                                    std::int64_t chunk, std::int64_t ignore_index) {
  const bool rec = grad_enabled();
  return kVocabParallelCE.call1(
      {h, w, targets}, {group, vocab_begin, vocab, chunk, ignore_index, rec && h.requires_grad(), rec && w.requires_grad()});
}

}  // namespace remat
