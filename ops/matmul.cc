// matmul: its definition (bmm and linear are built on it) and the CPU kernels.
#include "ops/matmul.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "ops/binary.h"
#include "ops/gemm.h"
#include "ops/kernel_util.h"
#include "ops/op.h"

namespace remat {

using namespace ops_detail;

KernelTable<MatmulKernels>& matmul_kernels() {
  static KernelTable<MatmulKernels> t("matmul");
  return t;
}

GemmOperand gemm_operand(const Tensor& t_in) {
  GemmOperand op;
  Tensor t = t_in;
  const std::int64_t nd = t.dim();
  const std::int64_t r = t.size(-2), c = t.size(-1);
  const std::int64_t sr = t.stride(-2), sc = t.stride(-1);
  // Batch dims must be expressible with one stride (contiguous over each
  // other). Size-1 dims are skipped: their strides are arbitrary (e.g. from
  // unsqueeze) and never stepped.
  bool batch_ok = true;
  std::int64_t bstride = 0, span = 0;  // stride of the innermost batch dim > 1, elements folded so far
  for (std::int64_t d = nd - 3; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (span == 0) {
      bstride = t.stride(d);
      span = t.size(d);
    } else if (t.stride(d) == bstride * span) {
      span *= t.size(d);
    } else {
      batch_ok = false;
    }
  }
  if (batch_ok && (sc == 1 || c == 1) && (sr >= c || r == 1)) {
    op.trans = false;
    op.ld = r == 1 ? std::max<std::int64_t>(c, 1) : sr;
  } else if (batch_ok && (sr == 1 || r == 1) && (sc >= r || c == 1)) {
    op.trans = true;
    op.ld = c == 1 ? std::max<std::int64_t>(r, 1) : sc;
  } else {
    t = t.contiguous();
    op.trans = false;
    op.ld = c;
    bstride = r * c;
  }
  op.keep = t;
  op.ptr = skip_compute(t) ? nullptr : t.raw_data();
  op.batch_stride = bstride;
  return op;
}

namespace {

// ---------------------------------------------------------------------------
// The op

struct MatmulState {
  bool two_d = true;         // b is 2-D: a's leading dims fold into m
  bool b_transposed = false; // a 2-D b stored transposed (linear's w.t())
};

void check(const OpDef& op, const std::vector<Tensor>& in, const MatmulState&) {
  const Tensor &a = in[0], &b = in[1];
  check_floating(op.name(), a, "first operand");
  check_same(op.name(), a, b);
  REMAT_CHECK(a.dim() >= 2 && b.dim() >= 2, ShapeError, op.name(), ": operands must have at least 2 dims, got ",
              describe(a), " and ", describe(b));
  REMAT_CHECK(a.size(-1) == b.size(-2), ShapeError, op.name(), ": inner dims differ: ", describe(a), " @ ",
              describe(b), " (", a.size(-1), " vs ", b.size(-2), ")");
  if (b.dim() != 2)
    REMAT_CHECK(Shape(b.sizes().begin(), b.sizes().end() - 2) == Shape(a.sizes().begin(), a.sizes().end() - 2),
                ShapeError, op.name(), ": batch dims differ: ", describe(a), " @ ", describe(b),
                " (batched products need identical batch dims, or a 2-D right operand)");
}

OpResults forward(const std::vector<Tensor>& in, MatmulState& s) {
  const Tensor &a = in[0], &b = in[1];
  const std::int64_t k = a.size(-1), n = b.size(-1);
  if (s.two_d) {  // a [..., m, k] @ b [k, n]: a's leading dims fold into m
    Shape out_shape(a.sizes().begin(), a.sizes().end() - 1);
    out_shape.push_back(n);
    const Tensor a2 = a.detach().reshape({-1, k});
    const std::int64_t m = a2.size(0);
    Tensor out = matmul_kernels().run(a.device(), &MatmulKernels::product, a2, b, Shape{m, n}, 1, m, n, k);
    return {{out.view(out_shape)}};
  }
  Shape out_shape(a.sizes().begin(), a.sizes().end() - 2);
  const std::int64_t batch = shape_numel(out_shape), m = a.size(-2);
  out_shape.push_back(m);
  out_shape.push_back(n);
  return {{matmul_kernels().run(a.device(), &MatmulKernels::product, a, b, out_shape, batch, m, n, k)}};
}

std::vector<Tensor> backward(const OpBackward<MatmulState>& bw) {
  const MatmulState& s = bw.state();
  const Tensor& g = bw.grad();
  const bool need_a = bw.needs(0), need_b = bw.needs(1);
  const Tensor bs = need_a ? bw.saved("b") : Tensor();
  const Tensor as = need_b ? bw.saved("a") : Tensor();
  const auto& kernels = matmul_kernels().on(g.device()).fns;
  if (s.two_d && need_a && need_b && !grad_enabled() && kernels.grads_2d && g.dtype() == DType::f32 &&
      as.dtype() == DType::f32 && bs.dtype() == DType::f32) {
    // One op call of its own, so op hooks (memory timeline phases, op tags)
    // see the backward's products.
    return run_op_call(OpCall{"matmul_backward", {g, as, bs}},
                       [&] { return matmul_kernels().run(g.device(), &MatmulKernels::grads_2d, g, as, bs,
                                                         s.b_transposed); });
  }
  Tensor ga, gb;
  if (need_a) ga = matmul(g, bs.transpose(-1, -2));
  if (need_b) {
    if (s.two_d) {  // sum over folded rows: a_flat^T @ g_flat
      const std::int64_t k = as.size(-1), nn = g.size(-1);
      const Tensor a2 = as.reshape({-1, k}), g2 = g.reshape({-1, nn});
      gb = s.b_transposed ? matmul(g2.t(), a2).t() : matmul(a2.t(), g2);
    } else {
      gb = matmul(as.transpose(-1, -2), g);
    }
  }
  return {ga, gb};
}

OpCost cost(const std::vector<Tensor>& in, const MatmulState&) {
  const Tensor &a = in[0], &b = in[1];
  const double m = double(a.numel() / std::max<std::int64_t>(a.size(-1), 1)), k = double(a.size(-1));
  const double n = double(b.size(-1));
  const double es = double(element_size(a.dtype()));
  return {2 * m * n * k, 0, (double(a.numel()) + double(b.numel()) + m * n) * es};
}

// The saves are the inputs, so they are made before the product: a
// checkpoint replay whose last needed saves these are stops here (early
// stop) without computing a product nobody reads (a block's down projection
// under per_block).
const Op<MatmulState> kMatmul({.name = "matmul",
                               .inputs = {"a", "b"},
                               .outputs = {{"out"}},
                               .saves = {{"a", SaveFrom::input, 0, inputs_mask({1})},
                                         {"b", SaveFrom::input, 1, inputs_mask({0})}},
                               .saves_inputs_first = true,
                               .replay_cacheable = true,
                               .summary = "matrix product, 2-D or batched (GEMM)"},
                              {.check = check, .forward = forward, .backward = backward, .cost = cost},
                              &matmul_kernels());

// ---------------------------------------------------------------------------
// CPU kernels (f32)

// out[b] = a[b] @ b[b] for each of `batch` matrices (batch 1 for 2-D).
Tensor product_cpu(const Tensor& a, const Tensor& b, const Shape& out_shape, std::int64_t batch, std::int64_t m,
                   std::int64_t n, std::int64_t k) {
  GemmOperand ga = gemm_operand(a.detach()), gb = gemm_operand(b.detach());
  Tensor out = empty(out_shape, DType::f32);
  if (skip_compute(out)) return out;
  float* po = out.data<float>();
  const auto* pa = static_cast<const float*>(ga.ptr);
  const auto* pb = static_cast<const float*>(gb.ptr);
  if (batch == 1) {
    gemm(ga.trans, gb.trans, m, n, k, 1.0f, pa, ga.ld, pb, gb.ld, 0.0f, po, n);
  } else {
    // Many small products: one thread per product beats splitting each.
    parallel_for(0, batch, 1, [&](std::int64_t b0, std::int64_t b1) {
      for (std::int64_t i = b0; i < b1; ++i)
        gemm(ga.trans, gb.trans, m, n, k, 1.0f, pa + i * ga.batch_stride, ga.ld, pb + i * gb.batch_stride, gb.ld,
             0.0f, po + i * m * n, n, /*serial=*/true);
    });
  }
  return out;
}

// The f32 product op(l) [m, k] @ op(r) [k, n] into a contiguous c [m, n].
PairedGemm product_args(const GemmOperand& l, const GemmOperand& r, std::int64_t m, std::int64_t n, std::int64_t k,
                        float* c) {
  PairedGemm g;
  g.trans_a = l.trans;
  g.trans_b = r.trans;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = static_cast<const float*>(l.ptr);
  g.lda = l.ld;
  g.b = static_cast<const float*>(r.ptr);
  g.ldb = r.ld;
  g.c = c;
  g.ldc = n;
  return g;
}

// The backward of a 2-D product a [..., k] @ b [k, n] needing both
// gradients: dA = g b^T and dB = a^T g (equal FLOPs) as one gemm_pair, side
// by side. dB is computed in b's storage layout when b is stored transposed.
std::vector<Tensor> grads_2d_cpu(const Tensor& g, const Tensor& a, const Tensor& b, bool b_transposed) {
  const std::int64_t k = a.size(-1), n = b.size(-1);
  const Tensor a2 = a.detach().reshape({-1, k}), g2 = g.detach().reshape({-1, n});
  const std::int64_t m = a2.size(0);
  const GemmOperand og = gemm_operand(g2), obt = gemm_operand(b.detach().t());
  Tensor ga = empty({m, k}, DType::f32);
  // dB [k, n], or its transpose [n, k] when b is stored transposed.
  const GemmOperand lhs = b_transposed ? gemm_operand(g2.t()) : gemm_operand(a2.t());
  const GemmOperand rhs = b_transposed ? gemm_operand(a2) : gemm_operand(g2);
  const std::int64_t rows = b_transposed ? n : k, cols = b_transposed ? k : n;
  Tensor gb = empty({rows, cols}, DType::f32);
  if (skip_compute(gb)) return std::vector<Tensor>{ga.view(a.sizes()), b_transposed ? gb.t() : gb};
  const PairedGemm first = product_args(og, obt, m, k, n, ga.data<float>());
  const PairedGemm second = product_args(lhs, rhs, rows, cols, m, gb.data<float>());
  gemm_pair(first, second);
  return std::vector<Tensor>{ga.view(a.sizes()), b_transposed ? gb.t() : gb};
}

void accumulate_cpu(Tensor& out, const Tensor& a, const Tensor& b) {
  const GemmOperand ga = gemm_operand(a.detach()), gb = gemm_operand(b.detach());
  if (skip_compute(out)) return;
  gemm(ga.trans, gb.trans, a.size(0), b.size(1), a.size(1), 1.0f, static_cast<const float*>(ga.ptr), ga.ld,
       static_cast<const float*>(gb.ptr), gb.ld, 1.0f, out.data<float>(), out.size(1));
}

const KernelRegistration<MatmulKernels> kCpu(
    matmul_kernels(), DeviceType::CPU,
    {.product = product_cpu, .grads_2d = grads_2d_cpu, .accumulate = accumulate_cpu}, KernelDTypes::f32);

}  // namespace

double cpu_gemm_peak_flops(int tries) {
  using Clock = std::chrono::steady_clock;
  const std::int64_t n = 1024;
  std::vector<float> a(static_cast<std::size_t>(n * n), 1.0f), b(a), c(a);
  double best = 0;
  for (int i = 0; i < tries; ++i) {
    const auto t0 = Clock::now();
    gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, 2.0 * double(n * n * n) / s);
  }
  return best;
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  // A 2-D right operand stored transposed (linear's w.t()): its gradient is
  // computed in the storage's layout, so it reaches w contiguous and
  // accumulates without a strided pass.
  const bool two_d = b.defined() && b.dim() == 2;
  const bool b_transposed = two_d && b.stride(0) == 1 && b.size(1) > 1;
  return kMatmul.call1({a, b}, {two_d, b_transposed});
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  REMAT_CHECK(a.dim() == 3 && b.dim() == 3, ShapeError, "bmm: expected 3-D operands, got ", describe(a), " and ",
              describe(b));
  REMAT_CHECK(a.size(0) == b.size(0), ShapeError, "bmm: batch sizes differ: ", describe(a), " and ", describe(b));
  return matmul(a, b);
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  check_floating("linear", x, "input");
  check_same("linear", x, w);
  REMAT_CHECK(w.dim() == 2, ShapeError, "linear: weight must be [out, in], got ", describe(w));
  REMAT_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1), ShapeError, "linear: input ", describe(x),
              " does not match weight ", describe(w), " (expected last dim ", w.size(1), ")");
  if (bias.defined()) {
    check_same("linear", x, bias);
    REMAT_CHECK(bias.dim() == 1 && bias.size(0) == w.size(0), ShapeError, "linear: bias must be [", w.size(0),
                "], got ", describe(bias));
  }
  Tensor y = matmul(x.dim() == 1 ? x.unsqueeze(0) : x, w.t());
  if (x.dim() == 1) y = y.squeeze(0);
  return bias.defined() ? add(y, bias) : y;
}

}  // namespace remat
