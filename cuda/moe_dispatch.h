// Row movement of a routed MoE block on CUDA: the dispatch gather (token rows
// to expert order), the weighted combine back to tokens and the row dot
// products of the combine's backward. Every result is the CPU's bit for bit:
// f32 arithmetic in the CPU's order (a token's rows summed in increasing row
// order, dots in the CPU's eight-lane scheme), one rounding to the output
// dtype, no atomics. Row-major contiguous buffers of width d throughout;
// floating dtypes f32, bf16, f16; indices i64.
#pragma once

#include <cstdint>

#include "engine/dtype.h"
#include "engine/memory_backend.h"

namespace remat::cuda {

// out[r, :] = x[src[r], :] * w[r] for r in [0, rows), in f32, rounded once to
// out_dtype; w (f32, [rows]) may be null (no scaling: a copy or a cast).
void moe_gather_rows(void* out, DType out_dtype, const void* x, DType x_dtype, const std::int64_t* src,
                     const float* w, std::int64_t rows, std::int64_t d, StreamId stream);

// row_of_slot[s] = the row r with slot_of_row[r] == s, or -1 where no row has
// slot s (a dropped slot); s in [0, slots), slot_of_row values distinct.
void moe_invert_rows(std::int64_t* row_of_slot, std::int64_t slots, const std::int64_t* slot_of_row,
                     std::int64_t rows, StreamId stream);

// out[t, :] = sum over token t's rows r (the non-negative entries of
// row_of_slot[t * top_k, (t + 1) * top_k)), in increasing r, of w[r] * y[r, :]:
// an f32 sum starting from 0, rounded once to out_dtype. w (f32, [rows]) may
// be null (weight 1). Tokens without rows get 0.
void moe_combine_rows(void* out, DType out_dtype, const void* y, DType y_dtype, const float* w,
                      const std::int64_t* row_of_slot, std::int64_t tokens, std::int64_t top_k, std::int64_t d,
                      StreamId stream);

// out[r] = dot(a[a_rows[r], :], b[r, :]) in f32 for r in [0, rows): lane j
// of eight sums elements j, j + 8, ... in order, then ((l0 + l4) + (l1 + l5))
// + ((l2 + l6) + (l3 + l7)) (ops_detail::lane_dot's order).
void moe_row_dots(float* out, const void* a, DType a_dtype, const std::int64_t* a_rows, const void* b,
                  DType b_dtype, std::int64_t rows, std::int64_t d, StreamId stream);

}  // namespace remat::cuda
