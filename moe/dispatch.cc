#include "moe/dispatch.h"

#include <cmath>

#include "checkpoint/recompute_context.h"
#include "engine/autograd.h"
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

// Counts the bytes of a gradient moved back during backward.
Tensor count_backward(const Tensor& t) {
  if (t.requires_grad())
    t.register_hook([](const Tensor& g) {
      tls_counters.backward_bytes_moved += std::int64_t(g.nbytes());
      return Tensor();
    });
  return t;
}
}  // namespace

DispatchCounters dispatch_counters() { return tls_counters; }
void reset_dispatch_counters() { tls_counters = DispatchCounters{}; }

Routing make_routing(const Tensor& indices, std::int64_t experts, double capacity_factor) {
  REMAT_CHECK(indices.dim() == 2 && indices.dtype() == DType::i64, ShapeError,
              "make_routing: indices must be [tokens, top_k] i64, got ", shape_str(indices.sizes()), " ",
              indices.dtype());
  Routing r;
  r.tokens = indices.size(0);
  r.top_k = indices.size(1);
  r.experts = experts;
  r.indices = indices;
  const auto idx = indices.contiguous().to_vector<std::int64_t>();
  const std::int64_t slots = r.tokens * r.top_k;
  const std::int64_t cap = capacity_factor > 0
                               ? std::int64_t(std::ceil(capacity_factor * double(slots) / double(experts)))
                               : slots;
  // Stable counting sort of slots by expert.
  std::vector<std::int64_t> count(std::size_t(experts), 0);
  for (std::int64_t s = 0; s < slots; ++s) {
    const std::int64_t e = idx[std::size_t(s)];
    REMAT_CHECK(e >= 0 && e < experts, ShapeError, "make_routing: expert index ", e, " at slot ", s,
                " is out of range for ", experts, " experts");
    ++count[std::size_t(e)];
  }
  r.counts.resize(std::size_t(experts));
  r.offsets.resize(std::size_t(experts));
  std::int64_t rows = 0;
  for (std::int64_t e = 0; e < experts; ++e) {
    r.counts[std::size_t(e)] = std::min(count[std::size_t(e)], cap);
    r.offsets[std::size_t(e)] = rows;
    rows += r.counts[std::size_t(e)];
    r.dropped += count[std::size_t(e)] - r.counts[std::size_t(e)];
  }
  std::vector<std::int64_t> token(static_cast<std::size_t>(rows)), slot(static_cast<std::size_t>(rows));
  std::vector<std::int64_t> fill(std::size_t(experts), 0);
  for (std::int64_t s = 0; s < slots; ++s) {
    const auto e = std::size_t(idx[std::size_t(s)]);
    if (fill[e] >= r.counts[e]) continue;  // over capacity: dropped
    const std::int64_t row = r.offsets[e] + fill[e]++;
    token[std::size_t(row)] = s / r.top_k;
    slot[std::size_t(row)] = s;
  }
  r.token_of_row = from_vector<std::int64_t>(token, {rows});
  r.slot_of_row = from_vector<std::int64_t>(slot, {rows});
  return r;
}

Tensor LocalDispatcher::dispatch(const Tensor& x, const Routing& routing) {
  tls_counters.dispatch_calls++;
  Tensor out = index_select(x, 0, routing.token_of_row);
  count_move(routing.rows(), std::int64_t(out.nbytes()));
  return count_backward(out);
}

Tensor LocalDispatcher::combine(const Tensor& y, const Tensor& row_weights, const Routing& routing) {
  tls_counters.combine_calls++;
  count_move(routing.rows(), std::int64_t(y.nbytes()));
  Tensor weighted = mul(y, row_weights.unsqueeze(1));
  Tensor base = zeros({routing.tokens, y.size(1)}, TensorOptions(y.dtype(), y.device()));
  return index_add(base, 0, routing.token_of_row, count_backward(weighted));
}

}  // namespace remat
