// Scaled dot-product attention over [B, H, S, D] tensors: a fused op that
// streams over key tiles (online softmax, never materialising S x S) and
// saves only O(B*H*S) beyond its inputs and output, plus an unfused reference
// built from matmul / softmax for tests and comparisons.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/tensor.h"
#include "ops/kernel_table.h"

namespace remat {

// softmax(q k^T * scale [+ causal mask]) v for q [B, H, S, D] and k, v
// [B, Hkv, S, D] of one dtype and device, Hkv dividing H (grouped-query
// attention: query head h reads key/value head h / (H / Hkv)); scale 0 means
// 1/sqrt(D). Causal masks key j for query i when j > i. Saves q, k, v (not
// repeated), the output and a [B, H, S] f32 log-sum-exp. The key/value
// gradients sum their query heads' terms in increasing head order.
// On the CPU: f32 tiles of 64 queries x 64 keys, compiled for AVX2 and for
// AVX-512 and chosen at run time (ops/simd.h); every path and thread count
// gives the same bits.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    bool causal = true, double scale = 0);

// The same function from matmul, softmax and a -1e30 additive mask: saves
// Theta(B*H*S^2) for backward. For testing the fused op.
Tensor attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = true,
                           double scale = 0);

// The problem one attention call solves: bh = B * H query heads of S rows
// of D; query head i reads key/value head i / group (group = H / Hkv: the
// query heads of one key/value head are consecutive, as in HF's repeat_kv).
struct AttentionGeometry {
  std::int64_t bh = 0, s = 0, d = 0;
  bool causal = true;
  float scale = 1.0f;
  std::int64_t group = 1;
};

// The kernels a device registers for scaled_dot_product_attention.
struct AttentionKernels {
  // {out [B, H, S, D], lse [B, H, S] f32} for q [B, H, S, D], k, v [B, Hkv, S, D].
  std::vector<Tensor> (*forward)(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionGeometry& g);
  // {dq, dk, dv} (each undefined unless asked for; dk and dv [B, Hkv, S, D],
  // each the sum of its query heads' terms in increasing head order).
  std::vector<Tensor> (*backward)(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, const AttentionGeometry& g, bool need_dq,
                                  bool need_dk, bool need_dv);
};
KernelTable<AttentionKernels>& attention_kernels();

namespace ops_detail {

// y[i] = exp(x[i]) for i < n through the CPU kernels' vector exp on the
// current path (ops/simd.h; the same bits on every path): within 1 ulp on
// [-86.5, 88.37], 0 below, +inf above, NaN kept. For tests.
void attention_exp(const float* x, float* y, std::int64_t n);

}  // namespace ops_detail
}  // namespace remat
