// SwiGLU kernels: out = silu(gate) * up and its fused gradient. Floating
// dtypes (f32, bf16, f16), computed in f32 with one rounding at the end, in
// the CPU kernel's order of operations (ops/swiglu.cc). Queued on `stream`.
#pragma once

#include "cuda/strided.h"
#include "engine/dtype.h"
#include "engine/memory_backend.h"

namespace remat::cuda {

// out = gate / (1 + exp(-gate)) * up element by element; out dense with
// gate_l's sizes, gate and up any layouts of those sizes.
void swiglu_forward(void* out, const void* gate, const Strided& gate_l, const void* up,
                    const Strided& up_l, DType dtype, StreamId stream);

// With s = sigmoid(gate): dgate = dy * up * s * (1 + gate * (1 - s)) and
// dup = dy * gate * s over n dense elements. dgate or dup may be null (not
// wanted); up is read only for dgate and may be null without it.
void swiglu_backward(void* dgate, void* dup, const void* dy, const void* gate, const void* up,
                     std::int64_t n, DType dtype, StreamId stream);

}  // namespace remat::cuda
