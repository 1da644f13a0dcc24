// The routed MoE layer of a block (Qwen2-MoE parameter names under
// "model.layers.{i}.mlp"): router "gate" [E, d], routed experts
// "experts.{e}.{gate,up,down}_proj" (hidden moe_ffn), an optional shared
// expert "shared_expert.*" (hidden ModelConfig::shared_hidden()) added
// unweighted, or with shared_gate times sigmoid(x . "shared_expert_gate"
// [1, d]). Mixtral (arch "mixtral"): the layer is "block_sparse_moe" and
// the experts' projections are w1 (gate), w3 (up), w2 (down).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/config.h"
#include "models/layers.h"
#include "moe/dispatch.h"

namespace remat {

// Routing metrics of one layer for one forward (original pass only).
struct MoELayerStats {
  std::int64_t layer = 0;
  std::vector<std::int64_t> tokens_per_expert;  // routed slots per expert (before capacity)
  double imbalance = 0;   // max / mean of tokens_per_expert
  std::int64_t dropped = 0;
  double aux = 0;         // load-balancing loss value
  double z = 0;           // router z-loss value (0 when off)
};

// Which experts this rank holds under expert parallelism: experts
// [rank * E / ranks, (rank + 1) * E / ranks). One process holds them all.
struct ExpertPlacement {
  std::int64_t rank = 0;
  std::int64_t ranks = 1;
};

// Where a layer reports its losses and metrics (once per original forward).
using MoESink = std::function<void(const Tensor& aux, const Tensor& z, const MoELayerStats& stats)>;

// Where a routed expert's index sits in a parameter name (or an optimizer
// state name that contains one): "model.layers.3.mlp.experts.5.up_proj.weight"
// (remat, Qwen2-MoE) or "model.layers.3.block_sparse_moe.experts.5.w3.weight"
// (Mixtral) -> layer 3, expert 5, `at` the offset of "5". Other names:
// expert -1 (and layer -1, at npos).
struct RoutedExpertName {
  std::int64_t layer = -1, expert = -1;
  std::size_t at = std::string::npos;
};
RoutedExpertName routed_expert_name(const std::string& name);

class MoELayer : public Module {
 public:
  // Initialises every expert's weights from `gen` in order (the ones this
  // rank does not hold only advance it), so any placement starts from the
  // same weights as one process.
  MoELayer(const ModelConfig& c, std::int64_t layer, Generator& gen, ExpertPlacement placement = {});
  // x [B, S, d] -> [B, S, d]. Losses and metrics go to `sink` in the
  // original pass only (never in a replay).
  Tensor forward(const Tensor& x) const;

  std::shared_ptr<Linear> gate;
  std::vector<std::shared_ptr<MLP>> experts;  // the held experts, first_expert() first
  std::shared_ptr<MLP> shared_expert;  // null without a shared expert
  std::shared_ptr<Linear> shared_expert_gate;  // null unless ModelConfig::shared_gate
  std::shared_ptr<TokenDispatcher> dispatcher;
  std::shared_ptr<BatchGroup> batch;  // the ranks sharing the global batch (router statistics)
  // Replays reuse the per-expert counts the forward exchanged instead of
  // exchanging them again (they route the same tokens).
  bool reuse_routing_metadata = false;
  std::int64_t first_expert() const { return first_expert_; }
  Tensor expert_bias;  // [E], added to the router scores for selection only (undefined: none)
  RegionWrap wrap;  // "moe", "moe_expert", "shared_experts" regions
  MoESink sink;

 private:
  Tensor routed_experts(const Tensor& xp, const Routing& routing) const;
  ModelConfig config_;
  std::int64_t layer_;
  std::int64_t first_expert_ = 0;
};

}  // namespace remat
