#include "ops/matmul.h"

#include "engine/dispatch.h"

#include "ops/binary.h"
#include "cuda/gemm.h"
#include "ops/gemm.h"
#include "ops/kernel_util.h"
#include "ops/reduce.h"

namespace remat {

using namespace ops_detail;

namespace {

// A 2-D (or batched 3-D) operand as the GEMM sees it: a pointer, whether it
// is stored transposed, its row stride and its batch stride. On the CPU the
// operand is f32; on CUDA it keeps its dtype (cuBLASLt accumulates in f32).
struct GemmOperand {
  Tensor keep;  // keeps the data alive
  const void* ptr = nullptr;
  bool trans = false;
  std::int64_t ld = 0;
  std::int64_t batch_stride = 0;
};

// `t` has shape [batch..., r, c]; `batch_dims` leading dims are batch dims
// that must collapse into one stride.
GemmOperand as_operand(const Tensor& t_in) {
  GemmOperand op;
  Tensor t = t_in.dtype() == DType::f32 || on_cuda(t_in) ? t_in : t_in.to(DType::f32);
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
  op.ptr = t.raw_data();
  op.batch_stride = bstride;
  return op;
}

// The CUDA product: cuBLASLt in the operands' dtype with f32 accumulation,
// its workspace from the caching allocator. Returns the output in `dtype`.
Tensor gemm_cuda(const GemmOperand& ga, const GemmOperand& gb, DType dtype, Device device,
                 const Shape& out_shape, std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k) {
  if constexpr (kHaveCuda) {
    Tensor out = empty(out_shape, TensorOptions(dtype, device));
    if (k == 0) return out.zero_();
    cuda::GemmArgs g;
    g.trans_a = ga.trans;
    g.trans_b = gb.trans;
    g.m = m;
    g.n = n;
    g.k = k;
    g.a = ga.ptr;
    g.lda = ga.ld;
    g.stride_a = ga.batch_stride;
    g.b = gb.ptr;
    g.ldb = gb.ld;
    g.stride_b = gb.batch_stride;
    g.c = out.raw_data();
    g.ldc = n;
    g.stride_c = m * n;
    g.batch = batch;
    g.dtype = dtype;
    Tensor workspace;
    {
      CategoryScope cat(MemoryCategory::workspace);
      workspace = empty({std::int64_t(cuda::gemm_workspace_bytes())}, TensorOptions(DType::boolean, device));
    }
    cuda::gemm(g, workspace.raw_data(), cuda::gemm_workspace_bytes(), cuda_stream());
    return out;
  } else {
    no_cuda_kernel("matmul");
  }
}

// out[b] = a[b] @ b[b] for each of `batch` matrices (batch 1 for 2-D).
Tensor gemm_batched(const Tensor& a, const Tensor& b, const Shape& out_shape, std::int64_t batch,
                    std::int64_t m, std::int64_t n, std::int64_t k) {
  NoGradGuard ng;
  GemmOperand ga = as_operand(a.detach()), gb = as_operand(b.detach());
  if constexpr (kHaveCuda) {
    if (on_cuda(a)) return gemm_cuda(ga, gb, a.dtype(), a.device(), out_shape, batch, m, n, k);
  }
  Tensor out = empty(out_shape, DType::f32);
  float* po = out.data<float>();
  const auto* pa = static_cast<const float*>(ga.ptr);
  const auto* pb = static_cast<const float*>(gb.ptr);
  if (batch == 1) {
    gemm(ga.trans, gb.trans, m, n, k, 1.0f, pa, ga.ld, pb, gb.ld, 0.0f, po, n);
  } else {
    // Many small products: one thread per product beats splitting each.
    parallel_for(0, batch, 1, [&](std::int64_t b0, std::int64_t b1) {
      for (std::int64_t i = b0; i < b1; ++i)
        gemm(ga.trans, gb.trans, m, n, k, 1.0f, pa + i * ga.batch_stride, ga.ld,
             pb + i * gb.batch_stride, gb.ld, 0.0f, po + i * m * n, n, /*serial=*/true);
    });
  }
  return out;
}

// The backward of a 2-D product a [..., k] @ b [k, n] needing both
// gradients, on the CPU in f32 outside grad mode: dA = g b^T and dB = a^T g
// (equal FLOPs) as one gemm_pair, side by side. dB is computed in b's storage
// layout when b is stored transposed. Only where side_by_side_applies().
// The f32 product op(l) [m, k] @ op(r) [k, n] into a contiguous c [m, n].
GemmArgs product_args(const GemmOperand& l, const GemmOperand& r, std::int64_t m, std::int64_t n, std::int64_t k,
                      float* c) {
  GemmArgs g;
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

bool side_by_side_applies(const Tensor& g, const Tensor& a, const Tensor& b) {
  return g.device().is_cpu() && g.dtype() == DType::f32 && a.dtype() == DType::f32 && b.dtype() == DType::f32;
}

std::vector<Tensor> cpu_grads_side_by_side(const Tensor& g, const Tensor& a, const Tensor& b, bool b_transposed) {
  NoGradGuard ng;
  const std::int64_t k = a.size(-1), n = b.size(-1);
  const Tensor a2 = a.detach().reshape({-1, k}), g2 = g.detach().reshape({-1, n});
  const std::int64_t m = a2.size(0);
  const GemmOperand og = as_operand(g2), obt = as_operand(b.detach().t());
  Tensor ga = empty({m, k}, DType::f32);
  const GemmArgs first = product_args(og, obt, m, k, n, ga.data<float>());
  // dB [k, n], or its transpose [n, k] when b is stored transposed.
  const GemmOperand lhs = b_transposed ? as_operand(g2.t()) : as_operand(a2.t());
  const GemmOperand rhs = b_transposed ? as_operand(a2) : as_operand(g2);
  const std::int64_t rows = b_transposed ? n : k, cols = b_transposed ? k : n;
  Tensor gb = empty({rows, cols}, DType::f32);
  const GemmArgs second = product_args(lhs, rhs, rows, cols, m, gb.data<float>());
  gemm_pair(first, second);
  return std::vector<Tensor>{ga.view(a.sizes()), b_transposed ? gb.t() : gb};
}

void check_matmul(const char* op, const Tensor& a, const Tensor& b) {
  check_floating(op, a, "first operand");
  check_same(op, a, b);
  check_kernel_device(op, a);
  REMAT_CHECK(a.dim() >= 2 && b.dim() >= 2, ShapeError, op, ": operands must have at least 2 dims, got ",
              describe(a), " and ", describe(b));
  REMAT_CHECK(a.size(-1) == b.size(-2), ShapeError, op, ": inner dims differ: ", describe(a), " @ ",
              describe(b), " (", a.size(-1), " vs ", b.size(-2), ")");
}

// a [..., m, k] @ b [k, n]: fold a's leading dims into m.
Tensor matmul_2d(const Tensor& a, const Tensor& b) {
  const std::int64_t k = a.size(-1), n = b.size(-1);
  Shape out_shape(a.sizes().begin(), a.sizes().end() - 1);
  out_shape.push_back(n);
  Tensor a2;
  {
    NoGradGuard ng;
    a2 = a.detach().reshape({-1, k});
  }
  Tensor out = gemm_batched(a2, b, {a2.size(0), n}, 1, a2.size(0), n, k);
  return from_f32(out.view(out_shape), a.dtype());
}

Tensor matmul_batched(const Tensor& a, const Tensor& b) {
  Shape batch_shape(a.sizes().begin(), a.sizes().end() - 2);
  REMAT_CHECK(Shape(b.sizes().begin(), b.sizes().end() - 2) == batch_shape, ShapeError,
              "matmul: batch dims differ: ", describe(a), " @ ", describe(b),
              " (batched products need identical batch dims, or a 2-D right operand)");
  const std::int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const std::int64_t batch = shape_numel(batch_shape);
  Shape out_shape = batch_shape;
  out_shape.push_back(m);
  out_shape.push_back(n);
  return from_f32(gemm_batched(a, b, out_shape, batch, m, n, k), a.dtype());
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_matmul("matmul", a, b);
  return dispatch1("matmul", {a, b}, [&] {
    const bool two_d = b.dim() == 2;
    // The saves are the inputs, so they are made before the product: a
    // checkpoint replay whose last needed saves these are stops here (early
    // stop) without computing a product nobody reads (a block's down
    // projection under per_block).
    auto node = autograd::make_node("matmul", {&a, &b});
    if (node) {
      node->save(node->needs_input_grad(1) ? a : Tensor());
      node->save(node->needs_input_grad(0) ? b : Tensor());
    }
    Tensor out = kernel_or_cached([&] {
      return std::vector<Tensor>{two_d ? matmul_2d(a, b) : matmul_batched(a, b)};
    })[0];
    if (node) {
      // A 2-D right operand stored transposed (linear's w.t()): its gradient
      // is computed in the storage's layout, so it reaches w contiguous and
      // accumulates without a strided pass.
      const bool b_transposed = two_d && b.stride(0) == 1 && b.size(1) > 1;
      node->backward_fn = [two_d, b_transposed](Node& n, std::vector<Tensor>& g) {
        // Each saved tensor is unpacked once: under a checkpoint region an
        // unpack hands the regenerated tensor over, and a second one would
        // replay the region again.
        const bool need_a = n.needs_input_grad(0), need_b = n.needs_input_grad(1);
        const Tensor bs = need_a ? n.saved(1) : Tensor();
        const Tensor as = need_b ? n.saved(0) : Tensor();
        if (two_d && need_a && need_b && !grad_enabled() && side_by_side_applies(g[0], as, bs)) {
          // One dispatched op, so dispatch hooks (memory timeline phases, op tags) see the backward's products.
          return dispatch("matmul_backward", {g[0], as, bs},
                          [&] { return cpu_grads_side_by_side(g[0], as, bs, b_transposed); });
        }
        Tensor ga, gb;
        if (need_a) ga = matmul(g[0], bs.transpose(-1, -2));
        if (need_b) {
          if (two_d) {
            // Sum over folded rows: a_flat^T @ g_flat.
            const std::int64_t k = as.size(-1), nn = g[0].size(-1);
            const Tensor a2 = as.reshape({-1, k}), g2 = g[0].reshape({-1, nn});
            gb = b_transposed ? matmul(g2.t(), a2).t() : matmul(a2.t(), g2);
          } else {
            gb = matmul(as.transpose(-1, -2), g[0]);
          }
        }
        return std::vector<Tensor>{ga, gb};
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  REMAT_CHECK(a.dim() == 3 && b.dim() == 3, ShapeError, "bmm: expected 3-D operands, got ",
              describe(a), " and ", describe(b));
  REMAT_CHECK(a.size(0) == b.size(0), ShapeError, "bmm: batch sizes differ: ", describe(a), " and ",
              describe(b));
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
    REMAT_CHECK(bias.dim() == 1 && bias.size(0) == w.size(0), ShapeError, "linear: bias must be [",
                w.size(0), "], got ", describe(bias));
  }
  Tensor y = matmul(x.dim() == 1 ? x.unsqueeze(0) : x, w.t());
  if (x.dim() == 1) y = y.squeeze(0);
  return bias.defined() ? add(y, bias) : y;
}

}  // namespace remat
