#include "train/parallel_layout.h"

#include <algorithm>

#include "moe/expert_parallel.h"

namespace remat {

ParallelLayout make_parallel_layout(std::shared_ptr<ProcessGroup> world, std::int64_t ep, const ModelConfig& c) {
  const int W = world->size();
  REMAT_CHECK(ep >= 1 && W % ep == 0, Error, "--ep ", ep, ": the expert-parallel degree must divide the ", W,
              " ranks of the job");
  REMAT_CHECK(ep == 1 || (c.experts > 0 && c.experts % ep == 0), Error, "--ep ", ep, ": config '", c.name,
              "' has ", c.experts, " routed experts, which cannot be split evenly over ", ep, " ranks");
  REMAT_CHECK(c.batch % W == 0, Error, "config '", c.name, "' has a global batch of ", c.batch,
              " sequences, which does not divide evenly over ", W, " ranks");
  ParallelLayout l;
  l.world = world;
  l.ep = ep;
  const int r = world->rank();
  if (W == 1) {
    l.ep_group = world;
    l.expert_replicas = world;
    return l;
  }
  l.ep_group = world->split(int(r / ep), r);
  l.expert_replicas = world->split(int(r % ep), r);
  l.grad_group = world->split(0, r);
  return l;
}

std::vector<std::shared_ptr<ProcessGroup>> ParallelLayout::groups() const {
  std::vector<std::shared_ptr<ProcessGroup>> g;
  for (const auto& p : {world, ep_group, expert_replicas, grad_group})
    if (p && std::find(g.begin(), g.end(), p) == g.end()) g.push_back(p);
  return g;
}

CommCounters ParallelLayout::counters() const {
  CommCounters c;
  for (const auto& g : groups()) c = c + g->counters();
  return c;
}

std::unique_ptr<GradReducer> make_grad_reducer(const ParallelLayout& layout,
                                               const std::vector<std::pair<std::string, Tensor>>& params,
                                               std::int64_t bucket_bytes) {
  if (layout.world->size() <= 1) return nullptr;
  std::vector<ReducedParameter> reduced;
  for (const auto& [name, p] : params) {
    const bool expert = is_expert_parameter(name);
    reduced.push_back({name, p, expert ? layout.expert_replicas : layout.grad_group, expert});
  }
  return std::make_unique<GradReducer>(std::move(reduced), bucket_bytes);
}

void apply_parallel_layout(DecoderModel& model, const ParallelLayout& layout, bool reuse_routing_metadata) {
  std::shared_ptr<BatchGroup> batch;
  if (layout.world->size() > 1) batch = std::make_shared<ProcessBatchGroup>(layout.world);
  for (auto& block : model.model->layers) {
    if (!block->moe) continue;
    if (batch) block->moe->batch = batch;
    block->moe->reuse_routing_metadata = reuse_routing_metadata;
    if (layout.ep > 1) {
      const std::size_t base = std::size_t(layout.world->rank() - layout.ep_group->rank());
      block->moe->dispatcher = std::make_shared<ExpertParallelDispatcher>(layout.ep_group, base);
    }
  }
}

Tensor batch_shard(const Tensor& global, const ProcessGroup& group) {
  const int W = group.size();
  if (W == 1) return global;
  REMAT_CHECK(global.size(0) % W == 0, ShapeError, "batch_shard: a batch of ", global.size(0),
              " does not split evenly over ", W, " ranks");
  const std::int64_t b = global.size(0) / W;
  return global.narrow(0, group.rank() * b, b).contiguous();
}

bool is_expert_parameter(const std::string& name) { return routed_expert_name(name).expert >= 0; }

}  // namespace remat
