// Losses. Computed in f32; the loss is a 0-dim f32 tensor.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/tensor.h"
#include "ops/kernel_table.h"

namespace remat {

// Mean over positions whose target != ignore_index of -log_softmax(logits)[target]:
// logits [..., C] floating, targets [...] i32/i64 (logits' leading shape) in
// [0, C). 0 (and zero gradients) when every target is ignored. Saves logits,
// targets and the per-row log-sum-exp (f32) for backward.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, std::int64_t ignore_index = -100);

// The kernels a device registers for cross_entropy. logits are [rows.., C];
// host_targets holds the targets (checked) in row-major order; count is the
// number of targets that are not ignore_index.
struct CrossEntropyKernels {
  // {loss (0-dim f32, the mean over counted rows, summed in row order), lse (f32 [rows]),
  // row_loss (f32 [rows]: lse - logits[target], 0 where ignored)}.
  std::vector<Tensor> (*forward)(const Tensor& logits, const Tensor& targets,
                                 const std::vector<std::int64_t>& host_targets, std::int64_t count,
                                 std::int64_t ignore_index);
  // dlogits = (softmax - onehot(target)) * g / count for counted rows, 0 for ignored ones.
  Tensor (*backward)(const Tensor& g, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                     std::int64_t count, std::int64_t ignore_index);
};
KernelTable<CrossEntropyKernels>& cross_entropy_kernels();

}  // namespace remat
