// RMSNorm and LayerNorm over the last dim on CUDA (ops/norm.h), forward and
// backward, each fused. Tensors are contiguous: x, y, grad and dx [rows, d],
// weight, bias, dw and db [d], all of one floating dtype; the per-row
// statistics (mean, rstd) are f32 [rows]. Everything is computed in f32 and
// rounded once to the dtype. Parameter gradients are summed over fixed row
// chunks, then over the chunks in order (no atomics): the same inputs give
// the same bits on every run. Every function queues work on `stream` and
// returns without waiting.
#pragma once

#include <cstdint>

#include "engine/dtype.h"
#include "engine/memory_backend.h"

namespace remat::cuda {

// Floats of workspace one parameter gradient (dw or db) needs for [rows, d].
std::int64_t norm_param_grad_workspace(std::int64_t rows, std::int64_t d);

// y = x * rstd * weight with rstd = 1 / sqrt(mean(x^2) + eps) per row; writes
// y and rstd.
void rms_norm_forward(void* y, float* rstd, const void* x, const void* weight, DType dtype,
                      std::int64_t rows, std::int64_t d, float eps, StreamId stream);

// dx = rstd * (g * w - x * rstd^2 * sum(g * w * x) / d) when dx is non-null
// (weight is then required); dw = sum over rows of g * x * rstd when dw is
// non-null, with workspace holding norm_param_grad_workspace(rows, d) floats.
void rms_norm_backward(void* dx, void* dw, const void* grad, const void* x, const void* weight,
                       const float* rstd, DType dtype, std::int64_t rows, std::int64_t d,
                       float* workspace, StreamId stream);

// y = (x - mean) * rstd * weight + bias (biased variance, rstd = 1 / sqrt(var
// + eps)); weight and bias may each be null (no scale / no shift). Writes y,
// mean and rstd.
void layer_norm_forward(void* y, float* mean, float* rstd, const void* x, const void* weight,
                        const void* bias, DType dtype, std::int64_t rows, std::int64_t d, float eps,
                        StreamId stream);

// With xhat = (x - mean) * rstd and gw = g * weight (g when weight is null):
// dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)) when dx is non-null;
// dw = sum over rows of g * xhat, db = sum over rows of g, each when non-null.
// x, mean and rstd are needed for dx and dw (may be null otherwise);
// workspace holds norm_param_grad_workspace(rows, d) floats for each of dw
// and db requested.
void layer_norm_backward(void* dx, void* dw, void* db, const void* grad, const void* x,
                         const void* weight, const float* mean, const float* rstd, DType dtype,
                         std::int64_t rows, std::int64_t d, float* workspace, StreamId stream);

}  // namespace remat::cuda
