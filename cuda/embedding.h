// Embedding kernels for ops/embedding.h on CUDA: the row gather of the
// forward and the deterministic row sums of the weight gradient (no float
// atomics: each touched row is summed by one block, in token order). Every
// function queues work on `stream` and returns without waiting; pointers are
// device pointers.
#pragma once

#include <cstdint>

#include "engine/dtype.h"
#include "engine/memory_backend.h"

namespace remat::cuda {

// out[t, :] = weight[ids[t], :] for t < n: weight is a contiguous [vocab, d]
// table of floating `dtype`, ids n contiguous i32/i64 values already checked
// to lie in [0, vocab), out a contiguous [n, d] buffer (rows copied bit for bit).
void embedding_forward(void* out, const void* weight, DType dtype, const void* ids, DType id_dtype,
                       std::int64_t n, std::int64_t d, StreamId stream);

// For t < touched: grad[rows[t], :] = round(sum of g[order[i], :] over i in
// [seg[t], seg[t + 1]), added in increasing i in f32 from 0), rows distinct.
// g is a contiguous [tokens, d] buffer and grad a contiguous [vocab, d] one,
// both of floating `dtype`; rows, seg (touched + 1 entries) and order are i64
// device arrays built on the host. Rows not listed are not written.
void embedding_backward(void* grad, const void* g, DType dtype, const std::int64_t* rows,
                        const std::int64_t* seg, const std::int64_t* order, std::int64_t touched,
                        std::int64_t d, StreamId stream);

}  // namespace remat::cuda
