// Routing metadata and the dispatch/combine step of a routed MoE block.
// Dispatch moves each routed (token, slot) row to its expert's contiguous
// range; combine moves the expert outputs back and sums them per token with
// the routing weights. Both are autograd ops behind TokenDispatcher, which an
// expert-parallel back end implements with all-to-all; LocalDispatcher moves
// rows inside one process. Every call is counted (rows, bytes), split into the
// original forward and replays.
#pragma once

#include <cstdint>
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
  std::vector<std::int64_t> counts;  // rows per expert (after capacity)
  std::vector<std::int64_t> offsets; // first row of each expert
  std::int64_t dropped = 0;          // slots over capacity
  std::int64_t rows() const { return token_of_row.defined() ? token_of_row.size(0) : 0; }
};

// Builds the routing for `indices` [tokens, top_k]. capacity_factor 0 keeps
// every slot (dropless); otherwise each expert keeps at most
// ceil(capacity_factor * tokens * top_k / experts) rows, in token order.
Routing make_routing(const Tensor& indices, std::int64_t experts, double capacity_factor);

// Dispatch/combine counters on this thread.
struct DispatchCounters {
  std::int64_t dispatch_calls = 0, combine_calls = 0;
  std::int64_t rows_moved = 0, bytes_moved = 0;                // original forward
  std::int64_t replay_rows_moved = 0, replay_bytes_moved = 0;  // inside recompute replays
  std::int64_t backward_bytes_moved = 0;                       // gradients moved in backward
};
DispatchCounters dispatch_counters();
void reset_dispatch_counters();

class TokenDispatcher {
 public:
  virtual ~TokenDispatcher() = default;
  // x [tokens, d] -> [rows, d]: row r is x[token_of_row[r]].
  virtual Tensor dispatch(const Tensor& x, const Routing& routing) = 0;
  // y [rows, d] and row weights [rows] -> [tokens, d]: out[t] = sum of
  // weight[r] * y[r] over the rows of token t.
  virtual Tensor combine(const Tensor& y, const Tensor& row_weights, const Routing& routing) = 0;
};

// Rows move inside this process (index_select / weighted index_add).
class LocalDispatcher final : public TokenDispatcher {
 public:
  Tensor dispatch(const Tensor& x, const Routing& routing) override;
  Tensor combine(const Tensor& y, const Tensor& row_weights, const Routing& routing) override;
};

}  // namespace remat
