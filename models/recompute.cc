#include "models/recompute.h"

namespace remat {

void apply_recompute_plan(DecoderModel& model, const RecomputePlan& plan) {
  const ModelConfig& c = model.config();
  bool any_moe = false;
  for (std::int64_t i = 0; i < c.n_layers; ++i) any_moe = any_moe || c.is_moe_layer(i);
  for (const auto& m : plan.modules)
    REMAT_CHECK(any_moe || (m != "moe_act" && m != "moe" && m != "shared_experts" && m != "moe_expert"), Error,
                "--recompute ", plan.spec, ": '", m, "' needs MoE blocks, but config '", c.name, "' has none");
  for (const auto& m : plan.modules)
    REMAT_CHECK(m != "shared_experts" || c.shared_hidden() > 0, Error, "--recompute ", plan.spec,
                ": 'shared_experts' needs shared experts, but config '", c.name, "' has none (shared and shared_ffn 0)");
  model.model->blocks->set_plan(plan);
}

}  // namespace remat
