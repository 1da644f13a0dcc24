// Helpers shared by op definitions and every device's op kernels (ops/,
// cuda/): operand checks with clear messages, contiguous and f32 copies, and
// the CPU kernels' parallel loops and deterministic lane sums.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/parallel_for.h"
#include "engine/tensor.h"

namespace remat::ops_detail {

// "[2, 3] f32 cpu" for error messages.
std::string describe(const Tensor& t);

// Throws unless `t` is defined.
void check_defined(const char* op, const Tensor& t, const char* what);
// Throws DTypeError unless `t` has a floating dtype.
void check_floating(const char* op, const Tensor& t, const char* what);
// Throws DTypeError unless `t` has dtype i32 or i64.
void check_index(const char* op, const Tensor& t, const char* what);
// Throws DTypeError / DeviceError unless a and b share dtype and device.
void check_same(const char* op, const Tensor& a, const Tensor& b);
// `t` detached and contiguous in its own dtype and device (no copy if it is).
Tensor contiguous_detached(const Tensor& t);

// Throws ShapeError unless t.dim() == n.
void check_dim(const char* op, const Tensor& t, std::int64_t n, const char* what);

// True when `t` is a meta tensor. A CPU kernel serves the meta device too
// (ops/kernel_table.h): it makes every tensor it would make, in the same
// order, and returns them as soon as skip_compute says so, before touching
// any memory.
inline bool skip_compute(const Tensor& t) { return t.defined() && t.device().is_meta(); }

// `t` as a contiguous f32 tensor (no copy if it already is one).
Tensor f32_contiguous(const Tensor& t);
// Converts an f32 result back to `dtype` (no copy if dtype is f32).
Tensor from_f32(const Tensor& t, DType dtype);

// Class targets (i32/i64, any device) read to the host as i64, each checked
// against [0, classes) or equal to ignore_index (ShapeError naming `op`, the
// value and its position). Returns how many are not ignore_index. Meta
// targets have no values: every one counts (out holds zeros).
std::int64_t read_class_targets(const char* op, const Tensor& targets, std::int64_t classes,
                                std::int64_t ignore_index, std::vector<std::int64_t>& out);
// The mean loss of `rows` per-row losses (0 for ignored rows) over `count`
// counted rows: summed in row order in double, so independent of the thread
// count and of how the rows were split; 0 when count is 0.
double mean_of_row_losses(const float* row_loss, std::int64_t rows, std::int64_t count);

// Runs fn(begin, end) over [0, n) in fixed blocks of kElementwiseBlock
// elements (the last may be shorter), spread over the threads. Block
// boundaries do not depend on the thread count, so vectorised kernels that
// peel unaligned heads give the same bits with any number of threads.
inline constexpr std::int64_t kElementwiseBlock = 4096;
template <typename Fn>
void parallel_elementwise(std::int64_t n, Fn&& fn) {
  const std::int64_t blocks = (n + kElementwiseBlock - 1) / kElementwiseBlock;
  parallel_for(0, blocks, 4, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b)
      fn(b * kElementwiseBlock, std::min(n, (b + 1) * kElementwiseBlock));
  });
}

// Runs fn(row_begin, row_end) over rows of `cols` elements each.
template <typename Fn>
void parallel_rows(std::int64_t rows, std::int64_t cols, Fn&& fn) {
  const std::int64_t grain = std::max<std::int64_t>(1, (1 << 14) / std::max<std::int64_t>(cols, 1));
  parallel_for(0, rows, grain, fn);
}

// Deterministic sum of p[0..n): eight float lanes, combined in a fixed order,
// independent of alignment and thread count.
inline float lane_sum(const float* p, std::int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += p[i + j];
  for (int j = 0; i < n; ++i, ++j) acc[j] += p[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// Deterministic dot product of a[0..n) and b[0..n) (same lane scheme).
inline float lane_dot(const float* a, const float* b, std::int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

}  // namespace remat::ops_detail
