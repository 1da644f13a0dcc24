// The gradient arithmetic the autograd engine itself runs on CUDA tensors:
// accumulation into a gradient buffer and the sum that undoes broadcasting.
// Both are deterministic (fixed summation order, no atomics).
#pragma once

#include <cstdint>

#include "cuda/strided.h"
#include "engine/dtype.h"
#include "engine/memory_backend.h"

namespace remat::cuda {

// dst[i] = dst[i] + src[i] over layouts of the same sizes, in f32, rounded
// to dst's dtype; a src of another dtype is first rounded to dst's dtype (as
// the CPU converts the gradient first). Floating dtypes only.
void add_into(void* dst, DType dst_dtype, const Strided& dst_l, const void* src, DType src_dtype,
              const Strided& src_l, StreamId stream);

// out[o] = sum of the `reduced` elements of input that map to output o: input
// element offset = offset_of(kept, o) + offset_of(reduced, r), summed over r
// in increasing order in f32 (the CPU's order, so small reductions match it
// bit for bit; very long reductions with few outputs sum fixed-size chunks,
// then the chunks in order). out is f32, contiguous, kept.numel() elements;
// workspace holds sum_reduced_workspace(kept, reduced) floats.
void sum_reduced(float* out, const void* in, DType in_dtype, const Strided& kept,
                 const Strided& reduced, float* workspace, StreamId stream);
// Floats of workspace sum_reduced needs (0 for the one-pass case).
std::int64_t sum_reduced_workspace(const Strided& kept, const Strided& reduced);

}  // namespace remat::cuda
