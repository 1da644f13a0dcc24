// Multi-tensor optimizer kernels: the AdamW update, the global sum of squares
// of the gradients (for norm clipping) and an in-place scale, each one launch
// over many f32 tensors. The caller builds an array of per-tensor slots on the
// host, uploads it to the device and passes the device pointer; each tensor is
// split into chunks of kMultiTensorChunk elements and one block handles one
// chunk. Slot i's chunks are [first_chunk, first_chunk + multi_tensor_chunks(numel)),
// the slots' ranges laid end to end in slot order (multi_tensor_layout fills
// first_chunk). All results are deterministic: no atomics, fixed orders.
#pragma once

#include <cstdint>

#include "engine/memory_backend.h"

namespace remat::cuda {

// Elements per chunk (one block each); a multiple of 4.
inline constexpr std::int64_t kMultiTensorChunk = 16384;

// Chunks a tensor of `numel` elements splits into (0 for an empty tensor).
constexpr std::int64_t multi_tensor_chunks(std::int64_t numel) {
  return numel <= 0 ? 0 : (numel + kMultiTensorChunk - 1) / kMultiTensorChunk;
}

// One tensor of an AdamW launch: contiguous f32 device buffers of numel elements.
struct AdamWSlot {
  float* param = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  std::int64_t numel = 0;
  std::int64_t first_chunk = 0;
  float decay = 1.0f;  // the parameter's multiplicative weight decay (1 for none)
};

// The step's scalars, computed on the host exactly as the CPU AdamW computes them.
struct AdamWScalars {
  float beta1 = 0, beta2 = 0;
  float one_minus_beta1 = 0, one_minus_beta2 = 0;  // (1.0f - beta) in f32
  float step_size = 0;     // lr / (1 - beta1^step)
  float inv_sqrt_bc2 = 0;  // 1 / sqrt(1 - beta2^step)
  float eps = 0;
};

// One tensor of a sum-of-squares or scale launch: a contiguous f32 device buffer.
struct TensorSlot {
  float* data = nullptr;
  std::int64_t numel = 0;
  std::int64_t first_chunk = 0;
};

// Sets first_chunk of slots[0..count) (host memory) to their ranges laid end
// to end and returns the total number of chunks.
template <typename Slot>
std::int64_t multi_tensor_layout(Slot* slots, std::int64_t count) {
  std::int64_t total = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    slots[i].first_chunk = total;
    total += multi_tensor_chunks(slots[i].numel);
  }
  return total;
}

// For every slot (device array of `count`) and element i, in f32 with the CPU
// AdamW's exact operations and order (no fused multiply-adds):
//   m = b1*m + (1-b1)*g;  v = b2*v + ((1-b2)*g)*g;
//   p = p*decay - (step_size*m) / (sqrt(v)*inv_sqrt_bc2 + eps).
// `total_chunks` is multi_tensor_layout's result.
void adamw_step(const AdamWSlot* slots, std::int64_t count, std::int64_t total_chunks, const AdamWScalars& s,
                StreamId stream);

// The sum over every slot's elements of double(x)^2, in double: each chunk
// sums its elements in a fixed order into partials[chunk], then one block adds
// the partials in a fixed order. `scratch` is device memory for total_chunks + 1
// doubles. Waits for the stream and returns the sum (0 for no chunks).
double sum_squares(const TensorSlot* slots, std::int64_t count, std::int64_t total_chunks, double* scratch,
                   StreamId stream);

// x = x * scale (f32) for every element of every slot, in place.
void scale_tensors(const TensorSlot* slots, std::int64_t count, std::int64_t total_chunks, float scale,
                   StreamId stream);

}  // namespace remat::cuda
