// Data and expert parallel layout of a decoder model over a ProcessGroup.
//
// Every rank of the world shares one global batch (each rank takes its
// consecutive 1/W of the sequences), so router statistics are summed over
// the world (ProcessBatchGroup) and every rank computes the global batch's
// aux and z losses. With --ep K the world is cut into expert-parallel groups
// of K consecutive ranks; rank j of a group holds experts [j*E/K, (j+1)*E/K)
// and ExpertParallelDispatcher moves token rows to the ranks that own their
// experts with all_to_all (and back in combine). Capacity is granted in
// global token order, so any K gives the routes of one process.
#pragma once

#include <memory>
#include <vector>

#include "models/decoder.h"
#include "moe/dispatch.h"
#include "parallel/grad_reducer.h"
#include "parallel/process_group.h"

namespace remat {

// Router statistics over the ranks of `group` (all_gather of the counts,
// differentiable all_reduce of the sums).
class ProcessBatchGroup final : public BatchGroup {
 public:
  explicit ProcessBatchGroup(std::shared_ptr<ProcessGroup> group) : group_(std::move(group)) {}
  int rank() const override { return group_->rank(); }
  int ranks() const override { return group_->size(); }
  SlotCounts gather_counts(const std::vector<std::int64_t>& local) override;
  Tensor sum(const Tensor& t) override;

 private:
  std::shared_ptr<ProcessGroup> group_;
};

// Rows move between the ranks of an expert-parallel group. `batch_base` is
// the batch-group rank of the group's rank 0 (the groups are consecutive).
class ExpertParallelDispatcher final : public TokenDispatcher {
 public:
  ExpertParallelDispatcher(std::shared_ptr<ProcessGroup> ep_group, std::size_t batch_base)
      : group_(std::move(ep_group)), base_(batch_base) {}
  Routing make_routing(const Tensor& indices, std::int64_t experts, const SlotCounts& counts,
                       double capacity_factor) override;
  std::int64_t first_expert(std::int64_t experts) const override;
  std::int64_t local_experts(std::int64_t experts) const override;
  // moe_dispatch (gather by expert), all_to_all to the owners, then the
  // received rows in expert-major order.
  Tensor dispatch(const Tensor& x, const Routing& routing) override;
  // The reverse: back to rank-major order, all_to_all home, moe_combine.
  Tensor combine(const Tensor& y, const Tensor& row_weights, const Routing& routing) override;

 private:
  std::shared_ptr<ProcessGroup> group_;
  std::size_t base_;
};

// The groups of a run on `world` with expert-parallel degree `ep`.
struct ParallelLayout {
  std::shared_ptr<ProcessGroup> world;
  std::shared_ptr<ProcessGroup> ep_group;         // the K ranks that split the experts
  std::shared_ptr<ProcessGroup> expert_replicas;  // the ranks holding the same experts (W / K)
  // The world again, on a communicator of its own for gradient buckets, so
  // their asynchronous all-reduces never interleave with the model's
  // collectives (null in one process).
  std::shared_ptr<ProcessGroup> grad_group;
  std::int64_t ep = 1;
  ExpertPlacement placement() const { return {ep_group->rank(), ep}; }
  // Every distinct group above (for totalling their counters).
  std::vector<std::shared_ptr<ProcessGroup>> groups() const;
  // The sum of their counters.
  CommCounters counters() const;
};
// Validates ep against the world and the config (the world size must divide
// the batch, ep must divide the world size and the expert count) and builds
// the sub-groups; a collective over `world`.
ParallelLayout make_parallel_layout(std::shared_ptr<ProcessGroup> world, std::int64_t ep, const ModelConfig& c);

// Points every MoE layer of `model` (built with layout.placement()) at the
// layout: router statistics over the world, rows over the expert-parallel
// group. `reuse_routing_metadata`: replays reuse the forward's counts.
void apply_parallel_layout(DecoderModel& model, const ParallelLayout& layout, bool reuse_routing_metadata);

// This rank's consecutive 1/size of a global batch (dim 0 must divide by
// the group's size; the batch itself in one process).
Tensor batch_shard(const Tensor& global, const ProcessGroup& group);

// True for the parameters of routed experts ("...mlp.experts.<e>...").
bool is_expert_parameter(const std::string& name);

// The gradient reducer of a data-parallel run: routed experts summed over
// their replicas (after backward: their readiness differs by rank), every
// other parameter over the world in buckets started during backward. Null
// in one process.
std::unique_ptr<GradReducer> make_grad_reducer(const ParallelLayout& layout,
                                               const std::vector<std::pair<std::string, Tensor>>& params,
                                               std::int64_t bucket_bytes);

}  // namespace remat
