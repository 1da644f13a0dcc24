#include "moe/expert_parallel.h"

#include "ops/ops.h"
#include "parallel/comm_ops.h"

namespace remat {

SlotCounts ProcessBatchGroup::gather_counts(const std::vector<std::int64_t>& local) {
  const auto E = std::int64_t(local.size());
  TagScope host(kHostTag);
  Tensor all = group_->all_gather(from_vector<std::int64_t>(local, {1, E}));
  const auto v = all.to_vector<std::int64_t>();
  SlotCounts c;
  c.rank = std::size_t(group_->rank());
  for (int r = 0; r < group_->size(); ++r)
    c.per_rank.emplace_back(v.begin() + r * E, v.begin() + (r + 1) * E);
  return c;
}

Tensor ProcessBatchGroup::sum(const Tensor& t) { return all_reduce_sum(group_, t); }

std::int64_t ExpertParallelDispatcher::local_experts(std::int64_t experts) const { return experts / group_->size(); }
std::int64_t ExpertParallelDispatcher::first_expert(std::int64_t experts) const {
  return group_->rank() * local_experts(experts);
}

Routing ExpertParallelDispatcher::make_routing(const Tensor& indices, std::int64_t experts, const SlotCounts& counts,
                                               double capacity_factor) {
  const std::size_t K = std::size_t(group_->size());
  REMAT_CHECK(experts % std::int64_t(K) == 0 && base_ + K <= counts.per_rank.size(), ShapeError,
              "expert parallel: ", experts, " experts over ", K, " ranks (base ", base_, ") with counts from ",
              counts.per_rank.size(), " ranks");
  const auto keep = kept_per_rank(counts, capacity_factor);
  Routing r = local_routing(indices, experts, counts, keep);
  const std::int64_t per = experts / std::int64_t(K);
  const std::int64_t first = first_expert(experts);
  const auto& mine = keep[counts.rank];
  r.expert_first = first;
  r.send_rows.assign(K, 0);
  r.recv_rows.assign(K, 0);
  r.expert_rows.assign(std::size_t(per), 0);
  r.expert_offsets.assign(std::size_t(per), 0);
  for (std::size_t j = 0; j < K; ++j)
    for (std::int64_t e = 0; e < per; ++e) {
      r.send_rows[j] += mine[std::size_t(std::int64_t(j) * per + e)];
      const std::int64_t n = keep[base_ + j][std::size_t(first + e)];
      r.recv_rows[j] += n;
      r.expert_rows[std::size_t(e)] += n;
    }
  for (std::int64_t e = 1; e < per; ++e)
    r.expert_offsets[std::size_t(e)] = r.expert_offsets[std::size_t(e - 1)] + r.expert_rows[std::size_t(e - 1)];
  // Received rows come source rank by source rank, each source's rows expert
  // by expert; the experts want them expert by expert, source by source
  // (which is global token order, as in one process).
  std::vector<std::int64_t> src_offset(K, 0);
  for (std::size_t j = 1; j < K; ++j) src_offset[j] = src_offset[j - 1] + r.recv_rows[j - 1];
  std::int64_t total = 0;
  for (auto n : r.recv_rows) total += n;
  std::vector<std::int64_t> order, inverse(static_cast<std::size_t>(total));
  order.reserve(std::size_t(total));
  for (std::int64_t e = 0; e < per; ++e)
    for (std::size_t j = 0; j < K; ++j) {
      std::int64_t at = src_offset[j];
      for (std::int64_t e2 = 0; e2 < e; ++e2) at += keep[base_ + j][std::size_t(first + e2)];
      const std::int64_t n = keep[base_ + j][std::size_t(first + e)];
      for (std::int64_t i = 0; i < n; ++i) {
        inverse[std::size_t(at + i)] = std::int64_t(order.size());
        order.push_back(at + i);
      }
    }
  r.recv_order = from_vector<std::int64_t>(order, {total}, indices.device());
  r.recv_order_inverse = from_vector<std::int64_t>(inverse, {total}, indices.device());
  return r;
}

Tensor ExpertParallelDispatcher::dispatch(const Tensor& x, const Routing& routing) {
  Tensor rows = moe_dispatch_rows(x, routing, /*lease=*/false);
  std::vector<std::int64_t> got;
  Tensor received = all_to_all(group_, rows, routing.send_rows, got, &routing.recv_rows);
  return index_select(received, 0, routing.recv_order);
}

Tensor ExpertParallelDispatcher::combine(const Tensor& y, const Tensor& row_weights, const Routing& routing) {
  REMAT_CHECK(y.dim() == 2 && y.size(0) == routing.recv_order.size(0), ShapeError, "moe_combine: expected ",
              routing.recv_order.size(0), " expert rows, got ", shape_str(y.sizes()));
  Tensor by_source = index_select(y, 0, routing.recv_order_inverse);
  std::vector<std::int64_t> got;
  Tensor home = all_to_all(group_, by_source, routing.recv_rows, got, &routing.send_rows);
  return moe_combine_rows(home, row_weights, routing);
}

}  // namespace remat
