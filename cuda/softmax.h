// Softmax, log-softmax and the fused cross-entropy over the last dim on CUDA
// (ops/softmax.h, ops/loss.h). Rows are contiguous [rows, n] of one floating
// dtype; everything is computed in f32 (the row maximum subtracted before
// exp) and rounded once to the dtype. Row sums use a fixed-order warp or
// block reduction, so the same inputs give the same bits on every run.
// Every function queues work on `stream` and returns without waiting.
#pragma once

#include <cstdint>

#include "engine/dtype.h"
#include "engine/memory_backend.h"

namespace remat::cuda {

// y = exp(x - max) / sum(exp(x - max)) per row, or with `log`
// y = x - max - log(sum(exp(x - max))).
void softmax_forward(void* y, const void* x, DType dtype, std::int64_t rows, std::int64_t n, bool log,
                     StreamId stream);

// From the forward output y and the gradient g: dx = y * (g - sum(g * y)),
// or with `log` dx = g - exp(y) * sum(g), per row.
void softmax_backward(void* dx, const void* grad, const void* y, DType dtype, std::int64_t rows,
                      std::int64_t n, bool log, StreamId stream);

// Cross-entropy of logits [rows, classes] (dtype) against targets [rows]
// (target_dtype i32 or i64, each in [0, classes) or == ignore_index; the
// caller checks). Writes lse[r] = log(sum(exp(logits[r]))) (f32) and *loss =
// (sum over counted rows of lse[r] - logits[r, target[r]]) / count, the sum
// taken in f64 in a fixed order (0 when count is 0). workspace holds `rows`
// floats.
void cross_entropy_forward(float* loss, float* lse, const void* logits, DType dtype, const void* targets,
                           DType target_dtype, std::int64_t rows, std::int64_t classes,
                           std::int64_t ignore_index, std::int64_t count, float* workspace,
                           StreamId stream);

// dlogits[r, j] = (exp(logits[r, j] - lse[r]) - (j == target[r])) * grad[0] /
// count for counted rows, 0 for ignored rows (and everywhere when count is
// 0). grad is one f32 on the device (the loss's upstream gradient).
void cross_entropy_backward(void* dlogits, const float* grad, const void* logits, const float* lse,
                            DType dtype, const void* targets, DType target_dtype, std::int64_t rows,
                            std::int64_t classes, std::int64_t ignore_index, std::int64_t count,
                            StreamId stream);

}  // namespace remat::cuda
