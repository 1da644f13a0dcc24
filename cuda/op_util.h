// What cuda/'s op kernels (the *_op.cc files) share: operand layouts as the
// kernels take them, the stream an op's kernels go on, and the operand
// checks and helpers of every device's op kernels (ops/kernel_util.h).
#pragma once

#include "cuda/strided.h"
#include "engine/device_runtime.h"
#include "engine/tensor.h"
#include "ops/kernel_util.h"

namespace remat::cuda {

using ops_detail::check_defined;
using ops_detail::contiguous_detached;
using ops_detail::describe;
using ops_detail::f32_contiguous;
using ops_detail::skip_compute;

// `t`'s sizes and strides as the kernels take them; throws ShapeError naming
// `op` for more than kMaxDims dims.
Strided layout_of(const char* op, const Tensor& t);

// The stream an op's CUDA kernels go on: the calling thread's current stream.
inline StreamId op_stream() { return current_stream(); }

}  // namespace remat::cuda
