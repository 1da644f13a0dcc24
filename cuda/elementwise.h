// Elementwise CUDA kernels: binary arithmetic with broadcasting, scalar
// arithmetic, the unary functions of ops/unary.h and their gradients, and
// in-place updates. Floating dtypes (f32, bf16, f16); every operand of one
// call has the same dtype. Values are computed in f32 with one rounding to the
// dtype at the end, the same formulas in the same order as the CPU kernels
// (no fused multiply-adds). Each function queues work on `stream`; DTypeError
// for other dtypes, DeviceError if a launch fails.
#pragma once

#include <cstdint>

#include "cuda/strided.h"
#include "engine/dtype.h"
#include "engine/memory_backend.h"

namespace remat::cuda {

enum class BinaryOp : std::uint8_t { add, sub, mul, div };

// out = a (op) b element by element. out is dense with a_l's sizes; a_l and
// b_l have the same sizes (broadcast operands have stride 0, e.g. from
// Tensor::expand) and any strides.
void binary(BinaryOp op, void* out, const void* a, const Strided& a_l, const void* b,
            const Strided& b_l, DType dtype, StreamId stream);

// out = a (op) s, or s (op) a when scalar_first; out dense with a_l's sizes.
// s is used as given (callers round it to the dtype first, as the CPU does).
void binary_scalar(BinaryOp op, void* out, const void* a, const Strided& a_l, float s,
                   bool scalar_first, DType dtype, StreamId stream);

// The ops of ops/unary.h. pow takes its exponent as `param`.
enum class UnaryOp : std::uint8_t {
  neg, exp, log, sqrt, rsqrt, pow, abs, relu, gelu, silu, sigmoid, tanh
};

// out = op(x) element by element; out dense with x_l's sizes, x any layout.
// gelu is the tanh approximation; param is pow's exponent (else unused).
void unary(UnaryOp op, void* out, const void* x, const Strided& x_l, DType dtype, float param,
           StreamId stream);

// The gradient of a unary op: out = dy * op'(...) from the tensor the op saved:
// its output y for exp, sqrt, rsqrt, relu, sigmoid, tanh, its input x for log,
// pow, abs, gelu, silu, nothing for neg (saved unused, may be null). out dense
// with dy_l's sizes; saved_l has the same sizes.
void unary_backward(UnaryOp op, void* out, const void* dy, const Strided& dy_l, const void* saved,
                    const Strided& saved_l, DType dtype, float param, StreamId stream);

enum class UpdateOp : std::uint8_t { add, mul, scale };

// In place through x's layout: x = x + alpha * y (add), x * y (mul) or
// x * alpha (scale; y unused, may be null). y_l has x_l's sizes (broadcast by
// stride 0); y may be x itself with the same layout, but not overlap it otherwise.
void update(UpdateOp op, void* x, const Strided& x_l, const void* y, const Strided& y_l,
            float alpha, DType dtype, StreamId stream);

}  // namespace remat::cuda
