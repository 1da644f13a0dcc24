// Dropout's CUDA kernel: the keep mask comes from the engine's Philox stream
// (engine/philox.h) word for word as the CPU kernel draws it, so a CPU and a
// CUDA dropout from the same generator state keep the same elements.
#pragma once

#include <cstdint>

#include "cuda/strided.h"
#include "engine/dtype.h"
#include "engine/memory_backend.h"

namespace remat::cuda {

// out[i] = (w_i >> 8) >= threshold ? x[i] * scale : 0 for every element i
// (row-major) of x_l, where w_i is word i % 4 of Philox block offset + i / 4
// keyed by seed. out dense, x any layout; floating dtypes, in f32 with one
// rounding. ops/dropout.cc passes threshold = ceil(p * 2^24), scale = 1/(1-p).
void dropout(void* out, const void* x, const Strided& x_l, DType dtype, std::uint64_t seed,
             std::uint64_t offset, std::uint32_t threshold, float scale, StreamId stream);

}  // namespace remat::cuda
