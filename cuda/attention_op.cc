// scaled_dot_product_attention's CUDA kernels (cuda/attention.h) registered
// for ops/attention.h: contiguous operands in their own dtype. The kernels
// take one head count, so grouped-query k and v are repeated for them (only
// the unrepeated ones are saved), and the key/value gradients per query head
// are summed back over each group in increasing head order.
#include "cuda/attention.h"
#include "cuda/op_util.h"
#include "ops/attention.h"
#include "ops/reduce.h"

namespace remat::cuda {
namespace {

// k or v [B, Hkv, S, D] repeated for the query heads of each group: [B, H, S, D], contiguous.
Tensor repeat_kv(const Tensor& t, const AttentionGeometry& g) {
  if (g.group == 1) return contiguous_detached(t);
  const std::int64_t B = t.size(0), Hkv = t.size(1), S = t.size(2), D = t.size(3);
  // With one key/value head the reshape can stay a view (head stride 0):
  // the kernels read [B, H, S, D] densely, so it is made contiguous.
  return contiguous_detached(
      contiguous_detached(t).view({B, Hkv, 1, S, D}).expand({B, Hkv, g.group, S, D}).reshape({B, Hkv * g.group, S, D}));
}

// A key/value gradient per query head summed over each group into [B, Hkv, S, D].
Tensor sum_query_groups(const Tensor& per_query_head, const AttentionGeometry& g, const Shape& kv_sizes) {
  if (!per_query_head.defined() || g.group == 1) return per_query_head;
  const std::int64_t rows = g.s * g.d, kv_heads = g.bh / g.group;
  return sum(per_query_head.view({kv_heads, g.group, rows}), {1}).view(kv_sizes);
}

void check_head_dim(const Tensor& q) {
  REMAT_CHECK(q.size(3) <= kAttentionMaxHeadDim, ShapeError,
              "scaled_dot_product_attention: the CUDA kernel takes head dims up to ", kAttentionMaxHeadDim, ", got ",
              describe(q));
}

std::vector<Tensor> forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionGeometry& geo) {
  check_head_dim(q);
  const Tensor qc = contiguous_detached(q), kc = repeat_kv(k, geo), vc = repeat_kv(v, geo);
  Tensor o = empty(q.sizes(), TensorOptions(q.dtype(), q.device()));
  Tensor l = empty({q.size(0), q.size(1), q.size(2)}, TensorOptions(DType::f32, q.device()));
  attention_forward(qc.raw_data(), kc.raw_data(), vc.raw_data(), o.raw_data(), l.data<float>(), geo.bh, geo.s,
                    geo.d, geo.causal, geo.scale, q.dtype(), op_stream());
  return {o, l};
}

std::vector<Tensor> backward(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out, const Tensor& lse, const AttentionGeometry& g, bool need_dq,
                             bool need_dk, bool need_dv) {
  const TensorOptions opts(q.dtype(), q.device());
  const Tensor qc = contiguous_detached(q), kc = repeat_kv(k, g), vc = repeat_kv(v, g);
  const Tensor oc = contiguous_detached(out), lc = contiguous_detached(lse);
  const Tensor gc = contiguous_detached(grad.dtype() == q.dtype() ? grad : grad.to(q.dtype()));
  Tensor dq, dk, dv;
  if (need_dq) dq = empty(q.sizes(), opts);
  if (need_dk) dk = empty(q.sizes(), opts);
  if (need_dv) dv = empty(q.sizes(), opts);
  Tensor delta = empty({g.bh, g.s}, TensorOptions(DType::f32, q.device()));
  auto ptr = [](const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; };
  attention_backward(qc.raw_data(), kc.raw_data(), vc.raw_data(), oc.raw_data(), gc.raw_data(), lc.data<float>(),
                     ptr(dq), ptr(dk), ptr(dv), delta.data<float>(), g.bh, g.s, g.d, g.causal, g.scale, q.dtype(),
                     op_stream());
  return {dq, sum_query_groups(dk, g, k.sizes()), sum_query_groups(dv, g, k.sizes())};
}

const KernelRegistration<AttentionKernels> kCuda(attention_kernels(), DeviceType::CUDA, {forward, backward},
                                                 KernelDTypes::native);

}  // namespace
}  // namespace remat::cuda
