#include "moe/dispatch.h"

#include <algorithm>
#include <cmath>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/recompute_context.h"
#include "ops/moe_rows.h"
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
  const auto idx = indices.contiguous().to_vector<std::int64_t>();
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
  const auto idx = indices.contiguous().to_vector<std::int64_t>();
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

}  // namespace

Tensor LocalDispatcher::dispatch(const Tensor& x, const Routing& routing) {
  return moe_dispatch_rows(x, routing, /*lease=*/true);
}

Tensor LocalDispatcher::combine(const Tensor& y, const Tensor& row_weights, const Routing& routing) {
  return moe_combine_rows(y, row_weights, routing);
}

Tensor moe_dispatch_rows(const Tensor& x, const Routing& routing, bool lease) {
  tls_counters.dispatch_calls++;
  const std::int64_t rows = routing.rows(), d = x.size(1);
  moe_rows_check_device("moe_dispatch", x);
  const bool dev = x.device().is_cuda();
  Tensor out = dispatch1("moe_dispatch", {x}, [&] {
    Tensor idx = routing.token_of_row.to(x.device()).contiguous();
    const bool keep = lease && grad_enabled() && x.requires_grad();
    // The CPU gathers in f32 and rounds once; CUDA writes x's dtype.
    Tensor o = payload_buffer({rows, d}, dev ? x.dtype() : DType::f32, x.device(), keep);
    moe_gather_rows_into(o, x, idx, Tensor());
    if (o.dtype() != x.dtype()) o = o.to(x.dtype());
    if (auto node = autograd::make_node("moe_dispatch", {&x})) {
      // CUDA sums each token's gradient rows from its slots' rows.
      node->save(dev ? routing.slot_of_row.to(x.device()).contiguous() : idx);
      node->backward_fn = [tokens = routing.tokens, top_k = routing.top_k, dt = x.dtype(), dev](
                              Node& n, std::vector<Tensor>& g) {
        Tensor i = n.saved(0);
        Tensor gx = dev ? moe_sum_token_rows(g[0], Tensor(), moe_row_of_slot(i, tokens, top_k, g[0].device()),
                                             tokens, top_k, dt)
                        : moe_scatter_add_rows(g[0], Tensor(), i, tokens, dt);
        tls_counters.backward_bytes_moved += std::int64_t(g[0].nbytes());
        return std::vector<Tensor>{gx};
      };
      autograd::set_history(o, node);
    }
    return o;
  });
  count_move(rows, std::int64_t(out.nbytes()));
  return out;
}

Tensor moe_combine_rows(const Tensor& y, const Tensor& row_weights, const Routing& routing) {
  tls_counters.combine_calls++;
  const std::int64_t rows = routing.rows(), tokens = routing.tokens;
  REMAT_CHECK(y.dim() == 2 && y.size(0) == rows && row_weights.dim() == 1 && row_weights.size(0) == rows, ShapeError,
              "moe_combine: expected expert rows [", rows, ", d] and weights [", rows, "], got ",
              shape_str(y.sizes()), " and ", shape_str(row_weights.sizes()));
  moe_rows_check_device("moe_combine", y, &row_weights);
  const bool dev = y.device().is_cuda();
  count_move(rows, std::int64_t(y.nbytes()));
  return dispatch1("moe_combine", {y, row_weights}, [&] {
    Tensor idx = routing.token_of_row.to(y.device()).contiguous();
    Tensor out = dev ? moe_sum_token_rows(y, row_weights,
                                          moe_row_of_slot(routing.slot_of_row, tokens, routing.top_k, y.device()),
                                          tokens, routing.top_k, y.dtype())
                     : moe_scatter_add_rows(y, row_weights, idx, tokens, y.dtype());
    if (auto node = autograd::make_node("moe_combine", {&y, &row_weights})) {
      node->save(node->needs_input_grad(1) ? y : Tensor());
      node->save(node->needs_input_grad(0) ? row_weights : Tensor());
      node->save(idx);
      node->backward_fn = [ydt = y.dtype(), wdt = row_weights.dtype()](Node& n, std::vector<Tensor>& g) {
        std::vector<Tensor> grads = moe_combine_grads(g[0], n.saved(0), n.saved(1), n.saved(2), n.needs_input_grad(0),
                                                      n.needs_input_grad(1), ydt, wdt);
        tls_counters.backward_bytes_moved += std::int64_t(g[0].nbytes());
        return grads;
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

}  // namespace remat
