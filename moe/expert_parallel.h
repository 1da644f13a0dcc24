// The expert-parallel dispatcher and the router statistics of ranks that
// share one global batch, over process groups (parallel/).
//
// Every rank of the world shares one global batch (each rank takes its
// consecutive 1/W of the sequences), so router statistics are summed over
// the world (ProcessBatchGroup) and every rank computes the global batch's
// aux and z losses. With --ep K the world is cut into expert-parallel groups
// of K consecutive ranks; rank j of a group holds experts [j*E/K, (j+1)*E/K)
// and ExpertParallelDispatcher moves token rows to the ranks that own their
// experts with all_to_all (and back in combine). Capacity is granted in
// global token order, so any K gives the routes of one process. Placing a
// decoder model on a layout of groups is train/parallel_layout.h.
#pragma once

#include <memory>
#include <vector>

#include "moe/dispatch.h"
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

}  // namespace remat
