// Fused scaled dot-product attention on CUDA (flash-attention style): the
// S x S score matrix is never written to global memory. q, k, v, out and the
// gradients are contiguous [BH, S, d] buffers of one floating dtype (f32, bf16
// or f16); lse and delta are contiguous [BH, S] f32. Head dims 1..128 (padded
// internally to 16, 32, 64 or 128). bf16 / f16 use tensor cores with f32
// accumulation; f32 uses f32 FMA. Every result is deterministic (fixed
// summation orders, no atomics). Work is queued on `stream`.
#pragma once

#include <cstdint>

#include "engine/dtype.h"
#include "engine/memory_backend.h"

namespace remat::cuda {

// The largest head dim the kernels take.
inline constexpr std::int64_t kAttentionMaxHeadDim = 128;

// out = softmax(q k^T * scale [+ causal mask: key j hidden from query i when
// j > i]) v, and lse[row] = log-sum-exp (natural log) of the scaled score row.
void attention_forward(const void* q, const void* k, const void* v, void* out, float* lse,
                       std::int64_t bh, std::int64_t s, std::int64_t d, bool causal, float scale,
                       DType dtype, StreamId stream);

// Gradients of attention_forward from dout, recomputing the probabilities from
// lse. dq, dk, dv may each be null (not computed); the others are fully
// written. delta is a [BH, S] f32 workspace (rowsum(dout * out)).
void attention_backward(const void* q, const void* k, const void* v, const void* out,
                        const void* dout, const float* lse, void* dq, void* dk, void* dv,
                        float* delta, std::int64_t bh, std::int64_t s, std::int64_t d, bool causal,
                        float scale, DType dtype, StreamId stream);

}  // namespace remat::cuda
