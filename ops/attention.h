// Scaled dot-product attention over [B, H, S, D] tensors: a fused op that
// streams over key tiles (online softmax, never materialising S x S) and
// saves only O(B*H*S) beyond its inputs and output, plus an unfused reference
// built from matmul / softmax for tests and comparisons.
#pragma once

#include "engine/tensor.h"

namespace remat {

// softmax(q k^T * scale [+ causal mask]) v for q, k, v [B, H, S, D] of one
// shape, dtype and device; scale 0 means 1/sqrt(D). Causal masks key j for
// query i when j > i. Saves q, k, v, the output and a [B, H, S] f32 log-sum-exp.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    bool causal = true, double scale = 0);

// The same function from matmul, softmax and a -1e30 additive mask: saves
// Theta(B*H*S^2) for backward. For testing the fused op.
Tensor attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = true,
                           double scale = 0);

}  // namespace remat
