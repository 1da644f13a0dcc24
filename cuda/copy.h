// Copies between CUDA buffers of any layout and dtype, and fills. Every
// function queues work on `stream` and returns without waiting.
#pragma once

#include <cstdint>

#include "cuda/strided.h"
#include "engine/dtype.h"
#include "engine/memory_backend.h"

namespace remat::cuda {

// dst[layout dst_l] = convert(src[layout src_l]) element by element; the two
// layouts have the same sizes. Conversions follow the CPU's: floats round to
// nearest even, floats to integers truncate, anything to bool is != 0, fp8
// saturates. Same dtype and both contiguous is one device-to-device memcpy.
void copy_strided(void* dst, DType dst_dtype, const Strided& dst_l, const void* src, DType src_dtype,
                  const Strided& src_l, StreamId stream);

// Sets n contiguous elements of dtype `dtype` at dst to `value` (converted as
// a CPU fill converts it).
void fill(void* dst, DType dtype, std::int64_t n, double value, StreamId stream);

}  // namespace remat::cuda
