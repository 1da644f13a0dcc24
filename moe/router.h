// The MoE router: logits from an FP32 copy of the block input (an
// output-discard checkpoint: the copy is not kept for backward), softmax over
// experts, top-K selection (ties to the lower expert index), renormalised
// top-K weights, the switch-style load-balancing loss E * sum_e f_e * P_e and
// the router z-loss. Selection may add an expert bias (selection only) or be
// uniformly random (seeded from the default generator, so a replay draws the
// same routes).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/tensor.h"

namespace remat {

struct RouterOptions {
  std::int64_t top_k = 2;
  bool random_routing = false;
  Tensor expert_bias;  // [E] added to the scores for selection only (optional)
  bool compute_z_loss = false;
  // Renormalise the top-K weights to sum to 1 (Mixtral, remat); false keeps
  // the chosen softmax probabilities as they are (Qwen2-MoE norm_topk_prob false).
  bool normalize_topk = true;
  // Data / expert parallel: the ranks that share the global batch.
  // `global_slots` maps this rank's slots per expert to the sums over them;
  // `global_sum` sums a f32 tensor over them (differentiably). With both set,
  // f_e, P_e, the z-loss and slots_per_expert describe the global batch.
  // Unset: this process's tokens only.
  std::function<std::vector<std::int64_t>(const std::vector<std::int64_t>&)> global_slots;
  std::function<Tensor(const Tensor&)> global_sum;
  // Wraps the choice of experts: given the computation of the [T, K]
  // indices, returns the ones to use (unset: compute them). MoE layers pass a
  // replay memo, so a checkpoint replay routes every token as the forward did
  // even when its input differs slightly (a compressed boundary).
  std::function<Tensor(const std::function<Tensor()>&)> select_indices;
};

struct RouterOutput {
  Tensor indices;  // [T, K] i64, best first
  Tensor weights;  // [T, K] chosen probabilities, renormalised unless asked not to (differentiable)
  Tensor probs;    // [T, E] f32
  Tensor aux;      // 0-dim: E * sum_e f_e * P_e
  Tensor z;        // 0-dim: mean over tokens of logsumexp(logits)^2 (undefined unless asked)
  std::vector<std::int64_t> slots_per_expert;  // f_e * T * K (over the global batch when parallel)
};

// Routes tokens x [T, d] with router weight [E, d].
RouterOutput route(const Tensor& x, const Tensor& router_weight, const RouterOptions& opts);

}  // namespace remat
