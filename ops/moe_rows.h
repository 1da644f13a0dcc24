// The row movement of a routed MoE block, CPU and CUDA: the dispatch gather
// (token rows to expert order), the weighted per-token sum of the combine and
// the combine's gradients. Every result is the same bits on both devices (f32
// arithmetic in the CPU's order, one rounding to the output dtype, no
// atomics; the CUDA kernels are cuda/moe_dispatch.h). moe/dispatch.cc builds
// the differentiable dispatch and combine on these (routing, counters and
// pooled buffers are the MoE layer's); they record no autograd history.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/tensor.h"

namespace remat {

// Throws DeviceError naming `op` unless `a` is on a device with these
// kernels (CPU or CUDA) and `b` (when given) is on the same device.
void moe_rows_check_device(const char* op, const Tensor& a, const Tensor* b = nullptr);

// out[r] = x[idx[r]] * w[r] for the rows of out (w undefined: weight 1, an
// exact copy), in f32 rounded once to out's dtype. out is a contiguous
// [rows, d] tensor (on the CPU: f32), x [tokens, d], idx i64 [rows] and w
// [rows], all on one device.
void moe_gather_rows_into(const Tensor& out, const Tensor& x, const Tensor& idx, const Tensor& w);

// CPU: out[t] = the sum over the rows r with token_of_row[r] == t, in
// increasing r, of w[r] * y[r] (w undefined: weight 1), in f32 rounded once
// to `dtype`; the order does not depend on the thread count. y [rows, d],
// token_of_row i64 [rows], out [tokens, d]. On CUDA the same sum is
// moe_sum_token_rows over moe_row_of_slot.
Tensor moe_scatter_add_rows(const Tensor& y, const Tensor& w, const Tensor& token_of_row, std::int64_t tokens,
                            DType dtype);

// CUDA: for every slot of `tokens` x `top_k`, its row in routing order or -1
// (dropped), on `device` (i64 [tokens * top_k]); slot_of_row lists each
// row's slot (distinct values).
Tensor moe_row_of_slot(const Tensor& slot_of_row, std::int64_t tokens, std::int64_t top_k, Device device);

// CUDA: out[t] = the sum over token t's rows r (row_of_slot[t * top_k ...],
// in increasing r) of w[r] * y[r] (w undefined: weight 1), in f32 rounded
// once to `dtype`; y is [rows, d], out [tokens, d].
Tensor moe_sum_token_rows(const Tensor& y, const Tensor& w, const Tensor& row_of_slot, std::int64_t tokens,
                          std::int64_t top_k, DType dtype);

// out[r] = dot(a[a_rows[r]], b[r]) in f32 (ops' eight-lane order) for the
// rows of b; a is [tokens, d], b [rows, d], a_rows i64 [rows]; out f32 [rows].
Tensor moe_row_dots(const Tensor& a, const Tensor& a_rows, const Tensor& b);

// The combine's gradients from g [tokens, d], the expert rows y [rows, d],
// their weights w [rows] and token_of_row: {gy, gw} with gy[r] = w[r] *
// g[token_of_row[r]] rounded to ydt (undefined unless want_gy; needs w) and
// gw[r] = dot(g[token_of_row[r]], y[r]) rounded to wdt (undefined unless
// want_gw; needs y).
std::vector<Tensor> moe_combine_grads(const Tensor& g, const Tensor& y, const Tensor& w, const Tensor& token_of_row,
                                      bool want_gy, bool want_gw, DType ydt, DType wdt);

}  // namespace remat
