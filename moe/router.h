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
  bool balanced_routing = false;  // slot s (token s / K) to expert s mod E (host_routes)
  Tensor expert_bias;  // [E] added to the scores for selection only (optional)
  bool compute_z_loss = false;
  // Renormalise the top-K weights to sum to 1 (Mixtral, remat); false keeps
  // the chosen softmax probabilities as they are (Qwen2-MoE norm_topk_prob false).
  bool normalize_topk = true;
};

// What route() asks of its caller: how the ranks that share the global batch
// are summed (data / expert parallel), and which experts to use given the
// computation of the choice. The caller owns it for one route() call
// (an MoE layer's is its expert-parallel exchange and replay memo).
class RoutingContext {
 public:
  virtual ~RoutingContext() = default;
  // True when ranks share the batch: f_e, P_e, the z-loss and
  // slots_per_expert then describe the global batch (global_slots and
  // global_sum are called); false: this process's tokens only.
  virtual bool global() const = 0;
  // This rank's slots per expert -> the sums over the ranks.
  virtual std::vector<std::int64_t> global_slots(const std::vector<std::int64_t>& local) = 0;
  // A f32 tensor summed over the ranks (differentiably).
  virtual Tensor global_sum(const Tensor& v) = 0;
  // The [T, K] indices to use, given their computation `choose` (an MoE
  // layer hands back a replay memo, so a checkpoint replay routes every token
  // as the forward did even when its input differs slightly: a compressed
  // boundary).
  virtual Tensor select_indices(const std::function<Tensor()>& choose) = 0;
};

// One process, nothing reused: its own tokens, the choice computed.
class LocalRouting final : public RoutingContext {
 public:
  bool global() const override { return false; }
  std::vector<std::int64_t> global_slots(const std::vector<std::int64_t>& local) override { return local; }
  Tensor global_sum(const Tensor& v) override { return v; }
  Tensor select_indices(const std::function<Tensor()>& choose) override { return choose(); }
};

struct RouterOutput {
  Tensor indices;  // [T, K] i64, best first
  Tensor weights;  // [T, K] chosen probabilities, renormalised unless asked not to (differentiable)
  Tensor probs;    // [T, E] f32
  Tensor aux;      // 0-dim: E * sum_e f_e * P_e
  Tensor z;        // 0-dim: mean over tokens of logsumexp(logits)^2 (undefined unless asked)
  std::vector<std::int64_t> slots_per_expert;  // f_e * T * K (over the global batch when parallel)
};

// The routes of `indices` [T, K] (i64) read to the host, slot by slot. A
// meta tensor has no values: its routes are the balanced ones, slot s to
// expert s mod `experts` (every expert T K / E slots), the CPU's host read
// mirrored on the meta allocator.
std::vector<std::int64_t> host_routes(const Tensor& indices, std::int64_t experts);

// Routes tokens x [T, d] with router weight [E, d], asking `context` for
// the ranks' sums and the choice (the first form: LocalRouting).
RouterOutput route(const Tensor& x, const Tensor& router_weight, const RouterOptions& opts);
RouterOutput route(const Tensor& x, const Tensor& router_weight, const RouterOptions& opts, RoutingContext& context);

}  // namespace remat
