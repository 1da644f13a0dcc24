// The row movement of a routed MoE block on CUDA tensors: the dispatch gather
// (token rows to expert order), the weighted per-token sum of the combine and
// the row dot products of the combine's backward, each the CPU's result bit
// for bit (f32 arithmetic in the CPU's order, one rounding, no atomics; see
// cuda/moe_dispatch.h). moe/dispatch.cc builds the differentiable dispatch
// and combine on these, next to its CPU loops. Not differentiable themselves;
// every function throws DeviceError for tensors that are not on CUDA.
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace remat {

// For every slot of `tokens` x `top_k`, its row in routing order or -1
// (dropped), on `device` (i64 [tokens * top_k]); slot_of_row lists each row's
// slot (distinct values).
Tensor moe_row_of_slot(const Tensor& slot_of_row, std::int64_t tokens, std::int64_t top_k, Device device);

// out[t] = the sum over token t's rows r (row_of_slot[t * top_k ...], in
// increasing r) of w[r] * y[r] (w undefined: weight 1), in f32 rounded once
// to `dtype`; y is [rows, d], out [tokens, d].
Tensor moe_sum_token_rows(const Tensor& y, const Tensor& w, const Tensor& row_of_slot, std::int64_t tokens,
                          std::int64_t top_k, DType dtype);

// out[r] = x[idx[r]] * w[r] for the rows of out (w undefined: weight 1), in
// f32 rounded once to out's dtype; out is a contiguous [rows, d] tensor, idx
// i64 [rows] on the same device.
void moe_gather_rows_into(const Tensor& out, const Tensor& x, const Tensor& idx, const Tensor& w);

// out[r] = dot(a[a_rows[r]], b[r]) in f32 (ops' eight-lane order) for the
// rows of b; a is [tokens, d], b [rows, d], a_rows i64 [rows]; out f32 [rows].
Tensor moe_row_dots(const Tensor& a, const Tensor& a_rows, const Tensor& b);

}  // namespace remat
