// Losses. Computed in f32; the loss is a 0-dim f32 tensor.
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace remat {

// Mean over positions whose target != ignore_index of -log_softmax(logits)[target]:
// logits [..., C] floating, targets [...] i32/i64 (logits' leading shape) in
// [0, C). 0 (and zero gradients) when every target is ignored. Saves logits,
// targets and the per-row log-sum-exp (f32) for backward.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, std::int64_t ignore_index = -100);

}  // namespace remat
