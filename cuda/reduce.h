// Reductions on CUDA (sum / mean / max over dims, ops/reduce.h). The input is
// any strided view, described as two layouts over the same data: `kept` (the
// dims that stay, in order) and `reduced` (the dims summed over, in order);
// element (o, r) lives at offset_of(kept, o) + offset_of(reduced, r). Floating
// dtypes; accumulation in f32 in an order fixed by the shapes and strides, so
// the same inputs give the same bits on every run. Every function queues work
// on `stream` and returns without waiting.
#pragma once

#include <cstdint>

#include "cuda/strided.h"
#include "engine/dtype.h"
#include "engine/memory_backend.h"

namespace remat::cuda {

// out[o] = scale * (sum over r of in[o, r]), rounded once to `dtype`; out is
// contiguous with kept.numel() elements of `dtype` (in's dtype). workspace
// holds reduce_sum_workspace(kept, reduced) floats (null when that is 0).
void reduce_sum(void* out, const void* in, DType dtype, const Strided& kept, const Strided& reduced,
                float scale, float* workspace, StreamId stream);
// Floats of workspace reduce_sum needs for these layouts (0 for most).
std::int64_t reduce_sum_workspace(const Strided& kept, const Strided& reduced);

// Maximum over one dim of `count` elements at element stride `stride`:
// values[o] = the maximum of in[o, 0..count) (dtype), index[o] = the first
// position holding it; a NaN wins over numbers (the first NaN). values and
// index are contiguous with kept.numel() elements; count >= 1.
void reduce_max(void* values, std::int64_t* index, const void* in, DType dtype, const Strided& kept,
                std::int64_t count, std::int64_t stride, StreamId stream);

// Gradient of reduce_max: dx[offset_of(kept, o) + index[o] * stride] = grad[o]
// (as 0 + grad[o] in f32, like the CPU's accumulation) for every output o of
// kept. dx (dtype) must be zero-filled by the caller; grad and index are
// contiguous with kept.numel() elements, grad of dtype.
void reduce_max_backward(void* dx, const Strided& kept, std::int64_t stride, const void* grad,
                         const std::int64_t* index, DType dtype, StreamId stream);

}  // namespace remat::cuda
