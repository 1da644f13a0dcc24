// MXFP8 (ops/mxfp8.h) on CUDA: the same packed layout and the same bits as
// the CPU codec. `packed` holds n e4m3 codes then ceil(n / 32) E8M0 exponent
// bytes; x and out are contiguous, n elements of `dtype` (f32, bf16 or f16).
// One warp per block of 32 values. Each function queues work on `stream` and
// returns without waiting; it throws DTypeError for other dtypes and
// DeviceError if the launch fails.
#pragma once

#include <cstdint>

#include "engine/dtype.h"
#include "engine/memory_backend.h"

namespace remat::cuda {

// Each block's exponent is the smallest with max|x| * 2^-e <= 448 (NaN left
// out of the max; a block holding inf gets 127), codes round to nearest even.
void mxfp8_quantize(std::uint8_t* packed, const void* x, DType dtype, std::int64_t n, StreamId stream);

// out[i] = e4m3(code[i]) * 2^(exp[block] - 127), rounded to nearest even to
// `dtype`; NaN codes give the CPU's NaN bits (positive quiet NaN).
void mxfp8_dequantize(void* out, DType dtype, const std::uint8_t* packed, std::int64_t n, StreamId stream);

}  // namespace remat::cuda
