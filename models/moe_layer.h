// The routed MoE layer of a block (Qwen2-MoE parameter names under
// "model.layers.{i}.mlp"): router "gate" [E, d], routed experts
// "experts.{e}.{gate,up,down}_proj" (hidden moe_ffn), an optional shared
// expert "shared_expert.*" (hidden ModelConfig::shared_hidden()) added
// unweighted, or with shared_gate times sigmoid(x . "shared_expert_gate"
// [1, d]). Mixtral (arch "mixtral"): the layer is "block_sparse_moe" and
// the experts' projections are w1 (gate), w3 (up), w2 (down).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/config.h"
#include "models/layers.h"
#include "moe/dispatch.h"
#include "moe/router.h"

namespace remat {

class SideOutputChannel;  // models/block_stack.h

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

// The MoE layers' loss terms and routing metrics of one forward, in the
// order the layers ran (the original pass only: a replay adds nothing).
struct MoETerms {
  std::vector<Tensor> aux;  // each layer's load-balancing loss (0-dim, differentiable)
  std::vector<Tensor> z;    // each layer's router z-loss (0-dim; only when ModelConfig::z_coef > 0)
  std::vector<MoELayerStats> stats;
  // Replays add their aux and z losses too (not their metrics): a reentrant
  // region's capture (moe_terms_channel), whose replay returns them again.
  bool replays = false;
};

// RAII: while alive on this thread, every MoE layer's original forward
// appends its terms to `terms` (the innermost scope's, when nested); with
// none open, a layer records nothing (generation).
class MoETermsScope {
 public:
  explicit MoETermsScope(MoETerms& terms);
  ~MoETermsScope();
  MoETermsScope(const MoETermsScope&) = delete;
  MoETermsScope& operator=(const MoETermsScope&) = delete;
  // The terms of the innermost scope open on this thread (null: none).
  static MoETerms* current();

 private:
  MoETerms* previous_;
};

// The router losses (aux, then z) and routing metrics of the MoE layers run
// inside a reentrant region, returned as the region's outputs and handed on
// to this thread's MoETermsScope (models/block_stack.h, SideOutputChannel):
// the metrics of the region's first run only, so they count once.
std::shared_ptr<SideOutputChannel> moe_terms_channel();

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
  // x [B, S, d] -> [B, S, d], the parts "moe" (the whole layer),
  // "moe_expert" (the routed experts) and "shared_experts" run through
  // `parts` (which must outlive the backward: a replay of part "moe" runs
  // its inner parts through it). The loss terms and metrics go to the
  // MoETermsScope open on this thread, in the original pass only (never in
  // a replay).
  Tensor forward(const Tensor& x, const PartRunner& parts = PartRunner::direct()) const;

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

 private:
  // The body of part "moe" on the tokens t [T, d]: route, dispatch, the
  // routed experts, combine, plus the shared expert.
  Tensor moe_part(const Tensor& t, const PartRunner& parts) const;
  RouterOptions router_options() const;
  // The dispatcher computes the expert range this layer holds (else Error).
  void check_dispatcher() const;
  Tensor routed_experts(const Tensor& xp, const Routing& routing) const;
  // The shared expert (gated when it has a gate) on t [T, d].
  Tensor shared_experts(const Tensor& t) const;
  // Appends the layer's terms and metrics to the open MoETermsScope's terms
  // (in a replay nothing, or only the terms where the scope takes replays).
  void report(const RouterOutput& r, const Routing& routing) const;
  ModelConfig config_;
  std::int64_t layer_;
  std::int64_t first_expert_ = 0;
};

}  // namespace remat
