#include "ops/loss.h"

#include <Eigen/Core>
#include <cmath>
#include <vector>

#include "cuda/softmax.h"
#include "ops/kernel_util.h"

namespace remat {

using namespace ops_detail;

namespace {

using ArrayMap = Eigen::Map<Eigen::ArrayXf>;
using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf>;

// Targets as i64, checked against [0, C) (ignore_index allowed). Returns the
// number of targets that count.
std::int64_t read_targets(const Tensor& targets, std::int64_t classes, std::int64_t ignore_index,
                          std::vector<std::int64_t>& out) {
  out = targets.detach().to_vector<std::int64_t>();
  const auto n = std::int64_t(out.size());
  std::int64_t count = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t v = out[std::size_t(i)];
    if (v == ignore_index) continue;
    REMAT_CHECK(v >= 0 && v < classes, ShapeError, "cross_entropy: target ", v, " at position ", i,
                " is out of range for ", classes, " classes (expected 0..", classes - 1,
                " or ignore_index ", ignore_index, ")");
    ++count;
  }
  return count;
}

struct CeForward {
  Tensor loss;  // 0-dim f32
  Tensor lse;   // f32 [rows]
};

// ce_forward on CUDA (targets already checked on the host): the per-row
// losses are summed in a fixed order on the device.
CeForward ce_forward_cuda(const Tensor& logits, const Tensor& targets, std::int64_t count,
                          std::int64_t ignore_index) {
  if constexpr (kHaveCuda) {
    NoGradGuard ng;
    const std::int64_t c = logits.size(-1);
    const std::int64_t rows = targets.numel();
    Tensor lc = contiguous_detached(logits), tc = contiguous_detached(targets);
    CeForward f{empty({}, TensorOptions(DType::f32, logits.device())),
                empty({rows}, TensorOptions(DType::f32, logits.device()))};
    Tensor row_loss = empty({rows}, TensorOptions(DType::f32, logits.device()));
    cuda::cross_entropy_forward(f.loss.data<float>(), f.lse.data<float>(), lc.raw_data(), lc.dtype(),
                                tc.raw_data(), tc.dtype(), rows, c, ignore_index, count,
                                row_loss.data<float>(), cuda_stream());
    return f;
  } else {
    no_cuda_kernel("cross_entropy");
  }
}

CeForward ce_forward(const Tensor& logits, const std::vector<std::int64_t>& tg,
                     std::int64_t count, std::int64_t ignore_index) {
  NoGradGuard ng;
  const std::int64_t c = logits.size(-1);
  const std::int64_t rows = std::int64_t(tg.size());
  Tensor lf = f32_contiguous(logits);
  Tensor lse = empty({rows}, DType::f32);
  const float* pl = lf.data<float>();
  float* ps = lse.data<float>();
  std::vector<float> row_loss(std::size_t(rows), 0.0f);
  parallel_rows(rows, c, [&](std::int64_t r0, std::int64_t r1) {
    Eigen::ArrayXf e(c);  // aligned scratch: exp results do not depend on addresses
    for (std::int64_t r = r0; r < r1; ++r) {
      ConstArrayMap row(pl + r * c, c);
      const float m = c > 0 ? row.maxCoeff() : 0.0f;
      e = (row - m).exp();
      const float s = m + std::log(lane_sum(e.data(), c));
      ps[r] = s;
      const std::int64_t t = tg[std::size_t(r)];
      if (t != ignore_index) row_loss[std::size_t(r)] = s - row[t];
    }
  });
  double total = 0;  // in row order: independent of the thread count
  for (float v : row_loss) total += double(v);
  const double mean = count > 0 ? total / double(count) : 0.0;
  return {full({}, mean, DType::f32), lse};
}

// dlogits = (softmax - onehot(target)) * g / count for counted rows, 0 for ignored ones.
Tensor ce_backward(const Tensor& g, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                   std::int64_t count, std::int64_t ignore_index) {
  NoGradGuard ng;
  const std::int64_t c = logits.size(-1);
  if constexpr (kHaveCuda) {
    if (on_cuda(logits)) {
      Tensor lc = contiguous_detached(logits), tc = contiguous_detached(targets);
      Tensor sc = contiguous_detached(lse);
      Tensor gc = contiguous_detached(g.dtype() == DType::f32 ? g : g.detach().to(DType::f32));
      Tensor dl = empty(logits.sizes(), TensorOptions(logits.dtype(), logits.device()));
      cuda::cross_entropy_backward(dl.raw_data(), gc.data<float>(), lc.raw_data(), sc.data<float>(),
                                   lc.dtype(), tc.raw_data(), tc.dtype(), tc.numel(), c, ignore_index, count,
                                   cuda_stream());
      return dl;
    }
  }
  std::vector<std::int64_t> tg;
  read_targets(targets, c, ignore_index, tg);
  const std::int64_t rows = std::int64_t(tg.size());
  Tensor lf = f32_contiguous(logits), sf = f32_contiguous(lse), gf = f32_contiguous(g);
  const float scale = count > 0 ? gf.data<float>()[0] / float(count) : 0.0f;
  Tensor dl = empty(logits.sizes(), DType::f32);
  const float* pl = lf.data<float>();
  const float* ps = sf.data<float>();
  float* pd = dl.data<float>();
  parallel_rows(rows, c, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      ArrayMap o(pd + r * c, c);
      const std::int64_t t = tg[std::size_t(r)];
      if (t == ignore_index) {
        o.setZero();
        continue;
      }
      o = (ConstArrayMap(pl + r * c, c) - ps[r]).exp() * scale;
      pd[r * c + t] -= scale;
    }
  });
  return from_f32(dl, logits.dtype());
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, std::int64_t ignore_index) {
  check_floating("cross_entropy", logits, "logits");
  check_index("cross_entropy", targets, "targets");
  check_kernel_device("cross_entropy", logits);
  REMAT_CHECK(targets.device() == logits.device(), DeviceError, "cross_entropy: targets ",
              describe(targets), " and logits ", describe(logits), " are on different devices");
  REMAT_CHECK(logits.dim() >= 1, ShapeError, "cross_entropy: logits must be [..., C], got ",
              describe(logits));
  const Shape lead(logits.sizes().begin(), logits.sizes().end() - 1);
  REMAT_CHECK(targets.sizes() == lead, ShapeError, "cross_entropy: targets ", describe(targets),
              " do not match logits ", describe(logits), " (expected targets of shape ",
              shape_str(lead), ")");
  const std::int64_t classes = logits.size(-1);
  std::vector<std::int64_t> tg;
  const std::int64_t count = read_targets(targets, classes, ignore_index, tg);
  return dispatch1("cross_entropy", {logits, targets}, [&] {
    CeForward f = on_cuda(logits) ? ce_forward_cuda(logits, targets, count, ignore_index)
                                  : ce_forward(logits, tg, count, ignore_index);
    Tensor out = f.loss;
    if (auto node = autograd::make_node("cross_entropy", {&logits, &targets})) {
      node->save(logits);
      node->save(targets);
      node->save(f.lse);
      node->backward_fn = [count, ignore_index](Node& n, std::vector<Tensor>& g) {
        return std::vector<Tensor>{
            ce_backward(g[0], n.saved(0), n.saved(1), n.saved(2), count, ignore_index), Tensor()};
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

}  // namespace remat
