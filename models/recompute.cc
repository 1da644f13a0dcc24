#include "models/recompute.h"

#include "checkpoint/checkpoint.h"

namespace remat {

void apply_recompute_plan(DecoderModel& model, const RecomputePlan& plan) {
  const ModelConfig& c = model.config();
  bool any_moe = false;
  for (std::int64_t i = 0; i < c.n_layers; ++i) any_moe = any_moe || c.is_moe_layer(i);
  for (const auto& m : plan.modules)
    REMAT_CHECK(any_moe || (m != "moe_act" && m != "moe" && m != "shared_experts" && m != "moe_expert"), Error,
                "--recompute ", plan.spec, ": '", m, "' needs MoE blocks, but config '", c.name, "' has none");

  // Module regions inside every block.
  RegionWrap wrap;
  if (!plan.modules.empty()) {
    auto modules = plan.modules;
    wrap = [modules](const std::string& part, const RegionFn& fn, const std::vector<Tensor>& in) {
      if (!modules.count(part)) return fn(in);
      CheckpointOptions o;
      o.name = part;
      return checkpoint(fn, in, o);
    };
  }
  for (auto& block : model.model->layers) {
    block->wrap = wrap;
    block->self_attn->wrap = wrap;
    if (block->moe) {
      block->moe->wrap = wrap;
      for (auto& e : block->moe->experts) e->recompute_activation = plan.modules.count("moe_act") > 0;
    }
  }

  if (plan.block_regions.empty()) {
    model.set_block_runner(nullptr);
    return;
  }
  // Block-level regions, in block order; blocks outside any region run plainly.
  std::vector<std::int64_t> region_of(std::size_t(c.n_layers), -1);
  for (std::size_t r = 0; r < plan.block_regions.size(); ++r)
    for (auto b : plan.block_regions[r]) region_of[std::size_t(b)] = std::int64_t(r);
  const auto regions = plan.block_regions;
  const Policy policy = plan.policy;
  model.set_block_runner([region_of, regions, policy](const DecoderModel& m, const Tensor& x) {
    Tensor h = x;
    const auto& layers = m.model->layers;
    for (std::int64_t i = 0; i < std::int64_t(layers.size());) {
      const std::int64_t r = region_of[std::size_t(i)];
      if (r < 0) {
        h = layers[std::size_t(i)]->forward(h);
        ++i;
        continue;
      }
      const auto& group = regions[std::size_t(r)];
      CheckpointOptions o;
      o.name = group.size() == 1 ? "block " + std::to_string(group[0])
                                 : "blocks " + std::to_string(group.front()) + "-" + std::to_string(group.back());
      o.policy = policy;
      const DecoderModel* mp = &m;
      h = checkpoint([mp, group](const Tensor& t) {
        Tensor u = t;
        for (auto b : group) u = mp->model->layers[std::size_t(b)]->forward(u);
        return u;
      }, h, o);
      i = group.back() + 1;
    }
    return h;
  });
}

}  // namespace remat
