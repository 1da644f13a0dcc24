#include "moe/dispatch.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/recompute_context.h"
#include "moe/router.h"
#include "ops/moe_rows.h"
#include "ops/op.h"
#include "ops/ops.h"

namespace remat {

namespace {
thread_local DispatchCounters tls_counters;

void count_move(std::int64_t rows, std::int64_t bytes) {
  if (in_recompute()) {
    tls_counters.replay_rows_moved += rows;
    tls_counters.replay_bytes_moved += bytes;
  } else {
    tls_counters.rows_moved += rows;
    tls_counters.bytes_moved += bytes;
  }
}

}  // namespace

DispatchCounters dispatch_counters() { return tls_counters; }
void count_metadata_reuse(std::int64_t bytes) {
  tls_counters.metadata_reuses++;
  tls_counters.metadata_bytes_saved += bytes;
}
void reset_dispatch_counters() { tls_counters = DispatchCounters{}; }

std::vector<std::int64_t> SlotCounts::total() const {
  std::vector<std::int64_t> t(per_rank.empty() ? 0 : per_rank[0].size(), 0);
  for (const auto& r : per_rank)
    for (std::size_t e = 0; e < t.size(); ++e) t[e] += r[e];
  return t;
}

std::vector<std::vector<std::int64_t>> kept_per_rank(const SlotCounts& counts, double capacity_factor) {
  auto keep = counts.per_rank;
  if (capacity_factor <= 0 || keep.empty()) return keep;
  const auto total = counts.total();
  std::int64_t slots = 0;
  for (auto c : total) slots += c;
  const auto experts = std::int64_t(total.size());
  const auto cap = std::int64_t(std::ceil(capacity_factor * double(slots) / double(experts)));
  for (std::size_t e = 0; e < total.size(); ++e) {
    std::int64_t before = 0;  // slots of earlier ranks (earlier tokens) for expert e
    for (auto& r : keep) {
      const std::int64_t c = r[e];
      r[e] = std::clamp<std::int64_t>(cap - before, 0, c);
      before += c;
    }
  }
  return keep;
}

std::vector<std::int64_t> slots_per_expert(const Tensor& indices, std::int64_t experts) {
  REMAT_CHECK(indices.dim() == 2 && indices.dtype() == DType::i64, ShapeError,
              "make_routing: indices must be [tokens, top_k] i64, got ", shape_str(indices.sizes()), " ",
              indices.dtype());
  std::vector<std::int64_t> count(std::size_t(experts), 0);
  const auto idx = host_routes(indices.contiguous(), experts);
  for (std::size_t s = 0; s < idx.size(); ++s) {
    const std::int64_t e = idx[s];
    REMAT_CHECK(e >= 0 && e < experts, ShapeError, "make_routing: expert index ", e, " at slot ", s,
                " is out of range for ", experts, " experts");
    ++count[std::size_t(e)];
  }
  return count;
}

Routing make_routing(const Tensor& indices, std::int64_t experts, double capacity_factor) {
  SlotCounts one;
  one.per_rank.push_back(slots_per_expert(indices, experts));
  return make_routing(indices, experts, kept_per_rank(one, capacity_factor)[0]);
}

Routing make_routing(const Tensor& indices, std::int64_t experts, const std::vector<std::int64_t>& keep) {
  const std::vector<std::int64_t> count = slots_per_expert(indices, experts);
  REMAT_CHECK(std::int64_t(keep.size()) == experts, ShapeError, "make_routing: ", keep.size(),
              " per-expert limits for ", experts, " experts");
  Routing r;
  r.tokens = indices.size(0);
  r.top_k = indices.size(1);
  r.experts = experts;
  r.indices = indices;
  const auto idx = host_routes(indices.contiguous(), experts);
  const std::int64_t slots = r.tokens * r.top_k;
  r.counts.resize(std::size_t(experts));
  r.offsets.resize(std::size_t(experts));
  std::int64_t rows = 0;
  for (std::int64_t e = 0; e < experts; ++e) {
    r.counts[std::size_t(e)] = std::min(count[std::size_t(e)], keep[std::size_t(e)]);
    r.offsets[std::size_t(e)] = rows;
    rows += r.counts[std::size_t(e)];
    r.dropped += count[std::size_t(e)] - r.counts[std::size_t(e)];
  }
  // Stable counting sort of the kept slots by expert.
  std::vector<std::int64_t> token(static_cast<std::size_t>(rows)), slot(static_cast<std::size_t>(rows));
  std::vector<std::int64_t> fill(std::size_t(experts), 0);
  for (std::int64_t s = 0; s < slots; ++s) {
    const auto e = std::size_t(idx[std::size_t(s)]);
    if (fill[e] >= r.counts[e]) continue;  // over capacity: dropped
    const std::int64_t row = r.offsets[e] + fill[e]++;
    token[std::size_t(row)] = s / r.top_k;
    slot[std::size_t(row)] = s;
  }
  // The row maps live with the indices (on CUDA for a CUDA router), so the
  // row movement and the weight gather index on the activations' device.
  r.token_of_row = from_vector<std::int64_t>(token, {rows}, indices.device());
  r.slot_of_row = from_vector<std::int64_t>(slot, {rows}, indices.device());
  r.expert_rows = r.counts;
  r.expert_offsets = r.offsets;
  return r;
}

SlotCounts BatchGroup::gather_counts(const std::vector<std::int64_t>& local) {
  SlotCounts c;
  c.per_rank.push_back(local);
  return c;
}

Routing TokenDispatcher::make_routing(const Tensor& indices, std::int64_t experts, const SlotCounts& counts,
                                      double capacity_factor) {
  return local_routing(indices, experts, counts, kept_per_rank(counts, capacity_factor));
}

Routing TokenDispatcher::local_routing(const Tensor& indices, std::int64_t experts, const SlotCounts& counts,
                                       const std::vector<std::vector<std::int64_t>>& keep) {
  Routing r = remat::make_routing(indices, experts, keep.at(counts.rank));
  r.dropped = 0;
  for (std::size_t k = 0; k < keep.size(); ++k)
    for (std::size_t e = 0; e < keep[k].size(); ++e) r.dropped += counts.per_rank[k][e] - keep[k][e];
  return r;
}

namespace {

// The payload outlives the forward only when a backward will read it: then
// it is allocated in the `communication` category, which names it in memory
// reports; inside a checkpoint region (or a replay, or without grad) it is
// ordinary scratch. Either way its memory goes back to the caching allocator
// when its last view dies, which hands the same block to the next step.
// (A pool of its own kept returned blocks allocated: once a payload died
// before the step's peak, in a later block's backward or after an offload,
// the peak counted it, one payload per MoE layer.)
Tensor payload_buffer(const Shape& sizes, DType dtype, Device device, bool needs_backward) {
  const bool in_region = current_save_region() >= 0 || in_recompute();
  if (!needs_backward || in_region) return empty(sizes, TensorOptions(dtype, device));
  CategoryScope cat(MemoryCategory::communication);
  return empty(sizes, TensorOptions(dtype, device));
}


// The attributes of a dispatch or combine call. `routing` is read by the
// forward only (it is cleared there: the node keeps the scalars); it is a
// copy the call owns, so that dynamic rematerialization, which keeps the
// state a call started with, can run the forward again after the layer's
// own routing is gone.
struct RowsState {
  std::shared_ptr<const Routing> routing;
  std::int64_t tokens = 0, top_k = 0;
  bool keep = false;  // dispatch: the payload outlives the forward (a backward reads it)
};

OpCost rows_cost(const std::vector<Tensor>& in, const RowsState&) {
  return {0, double(in[0].numel()), 2 * double(in[0].numel()) * double(element_size(in[0].dtype()))};
}

// moe_dispatch: token rows x [tokens, d] to expert order [rows, d].

OpResults dispatch_fwd(const std::vector<Tensor>& in, RowsState& s) {
  const Tensor& x = in[0];
  const std::shared_ptr<const Routing> held = std::move(s.routing);
  const Routing& routing = *held;
  const KernelTable<MoeRowsKernels>& k = moe_rows_kernels();
  Tensor idx = routing.token_of_row.to(x.device()).contiguous();
  Tensor o = payload_buffer({routing.rows(), x.size(1)}, k.compute_dtype(x.device(), x.dtype()), x.device(), s.keep);
  k.run(x.device(), &MoeRowsKernels::gather_rows, o, x, idx, Tensor());
  // What the backward's sum reads: each row's token (CPU) or slot (CUDA).
  return {{o}, {k.run(x.device(), &MoeRowsKernels::routing_index, routing.token_of_row, routing.slot_of_row,
                      x.device())}};
}

std::vector<Tensor> dispatch_backward(const OpBackward<RowsState>& b) {
  const Tensor& g = b.grad();
  Tensor gx = moe_rows_kernels().run(g.device(), &MoeRowsKernels::sum_rows, g, Tensor(), b.saved("rows"),
                                     b.state().tokens, b.state().top_k, b.input(0).dtype);
  tls_counters.backward_bytes_moved += std::int64_t(g.nbytes());
  return {gx};
}

const Op<RowsState> kDispatch({.name = "moe_dispatch",
                               .inputs = {"x"},
                               .outputs = {{"rows"}},
                               .saves = {{"rows", SaveFrom::intermediate, 0}},
                               .summary = "token rows gathered into expert order (a routed MoE block's dispatch)"},
                              {.forward = dispatch_fwd, .backward = dispatch_backward, .cost = rows_cost},
                              &moe_rows_kernels());

// moe_combine: expert rows y [rows, d] summed per token, weighted.

void check_combine(const OpDef& op, const std::vector<Tensor>& in, const RowsState& s) {
  const Tensor &y = in[0], &w = in[1];
  const std::int64_t rows = s.routing->rows();
  REMAT_CHECK(y.dim() == 2 && y.size(0) == rows && w.dim() == 1 && w.size(0) == rows, ShapeError, op.name(),
              ": expected expert rows [", rows, ", d] and weights [", rows, "], got ", shape_str(y.sizes()), " and ",
              shape_str(w.sizes()));
  REMAT_CHECK(y.device() == w.device(), DeviceError, op.name(), ": ", y.device(), " and ", w.device(),
              " hold the rows and their weights");
}

OpResults combine_fwd(const std::vector<Tensor>& in, RowsState& s) {
  const Tensor &y = in[0], &w = in[1];
  const std::shared_ptr<const Routing> held = std::move(s.routing);
  const Routing& routing = *held;
  const KernelTable<MoeRowsKernels>& k = moe_rows_kernels();
  Tensor idx = routing.token_of_row.to(y.device()).contiguous();
  const Tensor index = k.run(y.device(), &MoeRowsKernels::routing_index, routing.token_of_row, routing.slot_of_row,
                             y.device());
  return {{k.run(y.device(), &MoeRowsKernels::sum_rows, y, w, index, s.tokens, s.top_k, y.dtype())}, {idx}};
}

std::vector<Tensor> combine_backward(const OpBackward<RowsState>& b) {
  std::vector<Tensor> grads = moe_combine_grads(b.grad(), b.saved("y"), b.saved("weights"), b.saved("token_of_row"),
                                                b.needs(0), b.needs(1), b.input(0).dtype, b.input(1).dtype);
  tls_counters.backward_bytes_moved += std::int64_t(b.grad().nbytes());
  return grads;
}

const Op<RowsState> kCombine({.name = "moe_combine",
                              .inputs = {"y", "weights"},
                              .outputs = {{"out"}},
                              .saves = {{"y", SaveFrom::input, 0, inputs_mask({1})},
                                        {"weights", SaveFrom::input, 1, inputs_mask({0})},
                                        {"token_of_row", SaveFrom::intermediate, 0}},
                              .summary = "expert rows summed per token with their routing weights (the combine)"},
                             {.check = check_combine, .forward = combine_fwd, .backward = combine_backward,
                              .cost = rows_cost},
                             &moe_rows_kernels());

}  // namespace

Tensor LocalDispatcher::dispatch(const Tensor& x, const Routing& routing) {
  return moe_dispatch_rows(x, routing, /*lease=*/true);
}

Tensor LocalDispatcher::combine(const Tensor& y, const Tensor& row_weights, const Routing& routing) {
  return moe_combine_rows(y, row_weights, routing);
}

Tensor moe_dispatch_rows(const Tensor& x, const Routing& routing, bool lease) {
  tls_counters.dispatch_calls++;
  const bool keep = lease && grad_enabled() && x.requires_grad();
  Tensor out = kDispatch.call1({x}, {std::make_shared<const Routing>(routing), routing.tokens, routing.top_k, keep});
  count_move(routing.rows(), std::int64_t(out.nbytes()));
  return out;
}

Tensor moe_combine_rows(const Tensor& y, const Tensor& row_weights, const Routing& routing) {
  tls_counters.combine_calls++;
  count_move(routing.rows(), std::int64_t(y.nbytes()));
  return kCombine.call1({y, row_weights},
                        {std::make_shared<const Routing>(routing), routing.tokens, routing.top_k, false});
}

}  // namespace remat
