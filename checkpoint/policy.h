// Selective save policies: asked, for each op that runs inside a checkpoint
// region, whether its outputs are kept from the forward (so the replay reuses
// them and skips the op's kernel) or recomputed by the replay.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace remat {

// must_* always applies; prefer_* gives way to a `must` of an enclosing
// region's policy.
enum class SaveDecision { must_save, prefer_save, must_recompute, prefer_recompute };

// Maps an op name (as dispatched, e.g. "matmul") to a decision.
using Policy = std::function<SaveDecision(const std::string& op)>;

inline bool saves(SaveDecision d) {
  return d == SaveDecision::must_save || d == SaveDecision::prefer_save;
}

// Recompute everything (the plain checkpoint).
Policy recompute_all();
// Keep the results of matrix products ("matmul"), recompute the rest.
Policy save_matmul_outputs();
// Keep the fused attention's results ("scaled_dot_product_attention").
Policy save_attention_outputs();
// Keep the ops named in `ops`, recompute the rest.
Policy save_ops(std::vector<std::string> ops);

}  // namespace remat
