// Rotary position embedding kernels ("rotate half", ops/rotary.cc): a table
// of cos / sin per (position, pair), then the rotation of every row. Queued on
// `stream`.
#pragma once

#include <cstdint>

#include "cuda/strided.h"
#include "engine/dtype.h"
#include "engine/memory_backend.h"

namespace remat::cuda {

// cos_out[s * half + i] = cos(a), sin_out[s * half + i] = sign * sin(a) for
// s < seq, i < half, with a = (position_offset + s) * theta^(-2i / (2 half))
// computed in double and rounded to f32 (as the CPU kernel's table; device
// libm, so an entry may rarely differ from the CPU's by one f32 ulp).
void rotary_table(float* cos_out, float* sin_out, std::int64_t seq, std::int64_t half,
                  double theta, std::int64_t position_offset, float sign, StreamId stream);

// x [..., S, D] (layout x_l, any strides, D = 2 half even): row r of out
// (dense, x_l's sizes) is row r of x rotated by table row r % S:
//   out[i] = x[i] c - x[half + i] s,  out[half + i] = x[half + i] c + x[i] s
// with c, s the table's entries (i < half), in f32 with one rounding.
void rotary(void* out, const void* x, const Strided& x_l, DType dtype, const float* cos_table,
            const float* sin_table, StreamId stream);

}  // namespace remat::cuda
