// Routing metadata and the dispatch/combine step of a routed MoE block.
// Dispatch moves each routed (token, slot) row to its expert's contiguous
// range; combine moves the expert outputs back and sums them per token with
// the routing weights. Both are autograd ops behind TokenDispatcher:
// LocalDispatcher moves rows inside one process; the expert-parallel
// dispatcher (moe/expert_parallel.h) moves them between ranks with
// all-to-all. Every call is counted (rows, bytes), split into the original
// forward and replays.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/tensor.h"

namespace remat {

// Where each routed slot goes. Rows are the kept (token, slot) pairs sorted
// by expert with a stable sort, so row order within an expert follows token
// order and is the same every time.
struct Routing {
  std::int64_t tokens = 0;
  std::int64_t top_k = 0;
  std::int64_t experts = 0;
  Tensor indices;                    // [tokens, top_k] i64: expert of each slot
  Tensor token_of_row;               // [rows] i64: source token of each dispatched row
  Tensor slot_of_row;                // [rows] i64: flat slot (token * top_k + k) of each row
  std::vector<std::int64_t> counts;  // this rank's kept rows per expert
  std::vector<std::int64_t> offsets; // first row of each expert
  std::int64_t dropped = 0;          // slots over capacity, over every rank sharing the batch
  std::int64_t rows() const { return token_of_row.defined() ? token_of_row.size(0) : 0; }

  // The rows dispatch() returns: those of experts [expert_first,
  // expert_first + expert_rows.size()), expert by expert. In one process
  // these are all experts and equal counts/offsets.
  std::int64_t expert_first = 0;
  std::vector<std::int64_t> expert_rows, expert_offsets;

  // Expert parallel (empty in one process): rows sent to / received from
  // each rank of the expert-parallel group, and for each expert-ordered row
  // its index in the received (rank-major) order.
  std::vector<std::int64_t> send_rows, recv_rows;
  Tensor recv_order, recv_order_inverse;  // [received rows] i64
};

// Every rank's slots per expert before capacity, for the ranks that share a
// global batch (one entry per rank, in rank order; one entry in one process).
struct SlotCounts {
  std::vector<std::vector<std::int64_t>> per_rank;
  std::size_t rank = 0;  // this rank's entry
  // Sums over ranks, per expert.
  std::vector<std::int64_t> total() const;
};

// The rows each rank keeps per expert under a capacity: ceil(capacity_factor
// * all slots / experts) per expert over the whole batch, granted in global
// token order (rank 0's tokens first), exactly as one process on the global
// batch would. capacity_factor 0 keeps everything. Result: [rank][expert].
std::vector<std::vector<std::int64_t>> kept_per_rank(const SlotCounts& counts, double capacity_factor);

// Builds the routing for `indices` [tokens, top_k], keeping at most keep[e]
// rows of expert e (in token order). `dropped` counts this rank's drops.
Routing make_routing(const Tensor& indices, std::int64_t experts, const std::vector<std::int64_t>& keep);
// One process: capacity_factor 0 keeps every slot (dropless); otherwise each
// expert keeps at most ceil(capacity_factor * tokens * top_k / experts) rows.
Routing make_routing(const Tensor& indices, std::int64_t experts, double capacity_factor);

// The slots per expert of `indices` [tokens, top_k] i64.
std::vector<std::int64_t> slots_per_expert(const Tensor& indices, std::int64_t experts);

// Dispatch/combine counters on this thread.
struct DispatchCounters {
  std::int64_t dispatch_calls = 0, combine_calls = 0;
  std::int64_t rows_moved = 0, bytes_moved = 0;                // original forward
  std::int64_t replay_rows_moved = 0, replay_bytes_moved = 0;  // inside recompute replays
  std::int64_t backward_bytes_moved = 0;                       // gradients moved in backward
  // Replays that reused the forward's exchanged per-expert counts, and the
  // bytes this rank would have sent to exchange them again.
  std::int64_t metadata_reuses = 0, metadata_bytes_saved = 0;
};
DispatchCounters dispatch_counters();
void reset_dispatch_counters();
// Counts one reuse of exchanged counts that saved `bytes` of sending.
void count_metadata_reuse(std::int64_t bytes);

// The ranks that share one global batch (data or expert parallel). Router
// statistics are summed over them, so that every rank computes the losses
// and capacity of the global batch. The base class is one process alone.
class BatchGroup {
 public:
  virtual ~BatchGroup() = default;
  virtual int rank() const { return 0; }
  virtual int ranks() const { return 1; }
  // Every rank's slots per expert (this rank's is `local`).
  virtual SlotCounts gather_counts(const std::vector<std::int64_t>& local);
  // The sum of `t` over the ranks, differentiable.
  virtual Tensor sum(const Tensor& t) { return t; }
};

class TokenDispatcher {
 public:
  virtual ~TokenDispatcher() = default;
  // The routing of this rank's slots given every rank's counts.
  virtual Routing make_routing(const Tensor& indices, std::int64_t experts, const SlotCounts& counts,
                               double capacity_factor);
  // The experts this rank computes: [first, first + count) of `experts`.
  virtual std::int64_t first_expert(std::int64_t /*experts*/) const { return 0; }
  virtual std::int64_t local_experts(std::int64_t experts) const { return experts; }
  // x [tokens, d] -> [expert rows, d]: the rows of routing.expert_rows,
  // expert by expert (in one process: row r is x[token_of_row[r]]).
  virtual Tensor dispatch(const Tensor& x, const Routing& routing) = 0;
  // y [expert rows, d] and this rank's row weights [rows] -> [tokens, d]:
  // out[t] = sum of weight[r] * y[r] over the rows of token t.
  virtual Tensor combine(const Tensor& y, const Tensor& row_weights, const Routing& routing) = 0;

 protected:
  // This rank's routing given every rank's kept rows (kept_per_rank), with
  // `dropped` counted over all ranks.
  static Routing local_routing(const Tensor& indices, std::int64_t experts, const SlotCounts& counts,
                               const std::vector<std::vector<std::int64_t>>& keep);
};

// Rows move inside this process (index_select / weighted index_add).
class LocalDispatcher final : public TokenDispatcher {
 public:
  Tensor dispatch(const Tensor& x, const Routing& routing) override;
  Tensor combine(const Tensor& y, const Tensor& row_weights, const Routing& routing) override;
};

// The autograd ops behind the dispatchers, on this rank's rows:
// moe_dispatch gathers x's rows in routing order ([rows, d]); `lease` takes
// the payload from the dispatch buffer pool when a backward reads it.
Tensor moe_dispatch_rows(const Tensor& x, const Routing& routing, bool lease);
// moe_combine: y [rows, d] in routing order, weights [rows] -> [tokens, d].
Tensor moe_combine_rows(const Tensor& y, const Tensor& row_weights, const Routing& routing);

}  // namespace remat
