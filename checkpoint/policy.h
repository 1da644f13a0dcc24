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

// Maps an op name (its name in the op table, e.g. "matmul") to a decision.
using Policy = std::function<SaveDecision(const std::string& op)>;

inline bool saves(SaveDecision d) {
  return d == SaveDecision::must_save || d == SaveDecision::prefer_save;
}

// The ops whose kernels a selective replay can really skip: those whose
// record in the op table says replay_cacheable (engine/op_def.h; today
// "matmul" and "scaled_dot_product_attention"), sorted by name. Only their
// outputs are ever kept; a policy's save decision for any other op is
// ignored (it is recomputed, and nothing is held for it).
const std::vector<std::string>& replay_cacheable_ops();
bool replay_cacheable(const std::string& op);
// "matmul, scaled_dot_product_attention": the list above, for error messages.
std::string replay_cacheable_list();

// Recompute everything (the plain checkpoint).
Policy recompute_all();
// Keep the results of matrix products ("matmul"), recompute the rest.
Policy save_matmul_outputs();
// Keep the fused attention's results ("scaled_dot_product_attention").
Policy save_attention_outputs();
// Keep the ops named in `ops`, recompute the rest. Throws Error if `ops` is
// empty or names an op that is not in replay_cacheable_ops() (the message
// names it and lists the valid ones).
Policy save_ops(std::vector<std::string> ops);

}  // namespace remat
