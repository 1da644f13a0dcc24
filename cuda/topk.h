// Top-k kernels for ops/topk.h on CUDA: per-row selection with the CPU's
// strict order (larger first for largest, smaller first otherwise; NaN ranks
// above every number for largest and below for smallest; equal values,
// including -0.0 and 0.0, go to the lower index), and the backward scatter of
// the values' gradient. Every function queues work on `stream` and returns
// without waiting; pointers are device pointers.
#pragma once

#include <cstdint>

#include "cuda/strided.h"
#include "engine/dtype.h"
#include "engine/memory_backend.h"

namespace remat::cuda {

// For every row r < x_rows.numel() of n elements (element i of row r at
// offset_of(x_rows, r) + i * x_stride in x): the k <= n best elements, best
// first: values[o + j * out_stride] = the element (bit for bit) and
// indices[o + j * out_stride] = its position i, with o = offset_of(out_rows, r)
// (values and indices share that layout). x is floating `dtype`.
void topk(const void* x, DType dtype, const Strided& x_rows, std::int64_t x_stride, std::int64_t n,
          void* values, std::int64_t* indices, const Strided& out_rows, std::int64_t out_stride,
          std::int64_t k, bool largest, StreamId stream);

// The gradient of topk's values: for every row r of g_rows and j < k,
// grad_x[offset_of(gx_rows, r) + indices[offset_of(idx_rows, r) + j * idx_stride] * gx_stride]
//   = round(0.0f + f32(g[offset_of(g_rows, r) + j * g_stride])).
// The indices of a row are distinct, so each element is written once; the
// caller zeroes grad_x first. grad_x and g share floating `dtype`.
void topk_backward(void* grad_x, const Strided& gx_rows, std::int64_t gx_stride, const void* g,
                   const Strided& g_rows, std::int64_t g_stride, const std::int64_t* indices,
                   const Strided& idx_rows, std::int64_t idx_stride, DType dtype, std::int64_t k,
                   StreamId stream);

}  // namespace remat::cuda
