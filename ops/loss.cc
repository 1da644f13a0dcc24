// cross_entropy: its definition and CPU kernels.
#include "ops/loss.h"

#include <Eigen/Core>
#include <cmath>
#include <vector>

#include "engine/allocator.h"
#include "ops/kernel_util.h"
#include "ops/op.h"

namespace remat {

using namespace ops_detail;

KernelTable<CrossEntropyKernels>& cross_entropy_kernels() {
  static KernelTable<CrossEntropyKernels> t("cross_entropy");
  return t;
}

namespace {

using ArrayMap = Eigen::Map<Eigen::ArrayXf>;
using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf>;

// ---------------------------------------------------------------------------
// CPU kernels (f32)

std::vector<Tensor> forward_cpu(const Tensor& logits, const Tensor&, const std::vector<std::int64_t>& tg,
                                std::int64_t count, std::int64_t ignore_index) {
  const std::int64_t c = logits.size(-1);
  const std::int64_t rows = std::int64_t(tg.size());
  Tensor lf = f32_contiguous(logits);
  Tensor lse = empty({rows}, DType::f32), row_loss = zeros({rows}, DType::f32);
  if (skip_compute(lse)) return {full({}, 0.0, DType::f32), lse, row_loss};
  const float* pl = lf.data<float>();
  float* ps = lse.data<float>();
  float* pr = row_loss.data<float>();
  parallel_rows(rows, c, [&](std::int64_t r0, std::int64_t r1) {
    Eigen::ArrayXf e(c);  // aligned scratch: exp results do not depend on addresses
    for (std::int64_t r = r0; r < r1; ++r) {
      ConstArrayMap row(pl + r * c, c);
      const float m = c > 0 ? row.maxCoeff() : 0.0f;
      e = (row - m).exp();
      const float s = m + std::log(lane_sum(e.data(), c));
      ps[r] = s;
      const std::int64_t t = tg[std::size_t(r)];
      if (t != ignore_index) pr[r] = s - row[t];
    }
  });
  return {full({}, mean_of_row_losses(pr, rows, count), DType::f32), lse, row_loss};
}

Tensor backward_cpu(const Tensor& g, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                    std::int64_t count, std::int64_t ignore_index) {
  const std::int64_t c = logits.size(-1);
  std::vector<std::int64_t> tg;
  read_class_targets("cross_entropy", targets, c, ignore_index, tg);
  const std::int64_t rows = std::int64_t(tg.size());
  Tensor lf = f32_contiguous(logits), sf = f32_contiguous(lse), gf = f32_contiguous(g);
  if (skip_compute(gf)) return empty(logits.sizes(), DType::f32);
  const float scale = count > 0 ? gf.data<float>()[0] / float(count) : 0.0f;
  Tensor dl = empty(logits.sizes(), DType::f32);
  const float* pl = lf.data<float>();
  const float* ps = sf.data<float>();
  float* pd = dl.data<float>();
  parallel_rows(rows, c, [&](std::int64_t r0, std::int64_t r1) {
    // Aligned scratch, as in the forward: a row's exp bits must not depend
    // on where the row starts (the chunked loss's rows start elsewhere).
    Eigen::ArrayXf e(c);
    for (std::int64_t r = r0; r < r1; ++r) {
      ArrayMap o(pd + r * c, c);
      const std::int64_t t = tg[std::size_t(r)];
      if (t == ignore_index) {
        o.setZero();
        continue;
      }
      e = (ConstArrayMap(pl + r * c, c) - ps[r]).exp();
      o = e * scale;
      pd[r * c + t] -= scale;
    }
  });
  return dl;
}

const KernelRegistration<CrossEntropyKernels> kCpu(cross_entropy_kernels(), DeviceType::CPU,
                                                   {forward_cpu, backward_cpu}, KernelDTypes::f32);

// ---------------------------------------------------------------------------
// The op

struct CrossEntropyState {
  std::int64_t ignore_index = -100;
  std::int64_t count = 0;  // targets that count, set by the forward
};

void check(const OpDef& op, const std::vector<Tensor>& in, const CrossEntropyState&) {
  const Tensor &logits = in[0], &targets = in[1];
  check_floating(op.name(), logits, "logits");
  check_index(op.name(), targets, "targets");
  REMAT_CHECK(targets.device() == logits.device(), DeviceError, op.name(), ": targets ", describe(targets),
              " and logits ", describe(logits), " are on different devices");
  REMAT_CHECK(logits.dim() >= 1, ShapeError, op.name(), ": logits must be [..., C], got ", describe(logits));
  const Shape lead(logits.sizes().begin(), logits.sizes().end() - 1);
  REMAT_CHECK(targets.sizes() == lead, ShapeError, op.name(), ": targets ", describe(targets),
              " do not match logits ", describe(logits), " (expected targets of shape ", shape_str(lead), ")");
}

OpResults forward(const std::vector<Tensor>& in, CrossEntropyState& s) {
  const Tensor &logits = in[0], &targets = in[1];
  std::vector<std::int64_t> tg;
  s.count = read_class_targets("cross_entropy", targets, logits.size(-1), s.ignore_index, tg);
  std::vector<Tensor> f = cross_entropy_kernels().run(logits.device(), &CrossEntropyKernels::forward, logits,
                                                      targets, tg, s.count, s.ignore_index);
  return {{f[0]}, {f[1]}};
}

std::vector<Tensor> backward(const OpBackward<CrossEntropyState>& b) {
  const CrossEntropyState& s = b.state();
  CategoryScope cat(MemoryCategory::loss);  // the logits' gradient: the loss's bytes, not a parameter's
  return {cross_entropy_kernels().run(b.grad().device(), &CrossEntropyKernels::backward, b.grad(),
                                      b.saved("logits"), b.saved("targets"), b.saved("lse"), s.count,
                                      s.ignore_index),
          Tensor()};
}

OpCost cost(const std::vector<Tensor>& in, const CrossEntropyState&) {
  const double n = double(in[0].numel());
  return {0, 4 * n, n * double(element_size(in[0].dtype()))};
}

const Op<CrossEntropyState> kCrossEntropy(
    {.name = "cross_entropy",
     .inputs = {"logits", "targets"},
     .outputs = {{"loss", always(DType::f32)}},
     .saves = {{"logits", SaveFrom::input, 0},
               {"targets", SaveFrom::input, 1},
               {"lse", SaveFrom::intermediate, 0}},
     .summary = "mean -log_softmax(logits)[target] over counted positions"},
    {.check = check, .forward = forward, .backward = backward, .cost = cost}, &cross_entropy_kernels());

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, std::int64_t ignore_index) {
  return kCrossEntropy.call1({logits, targets}, {ignore_index, 0});
}

}  // namespace remat
