#include "moe/dispatch.h"

#include <algorithm>
#include <cmath>

#include "checkpoint/recompute_context.h"
#include "engine/autograd.h"
#include "moe/buffer_pool.h"
#include "ops/kernel_util.h"
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

// Copies rows: out[r] = x[src[r]] (x, out contiguous f32 of width d).
void gather_rows(const float* x, const std::int64_t* src, float* out, std::int64_t rows, std::int64_t d) {
  ops_detail::parallel_rows(rows, d, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) std::copy_n(x + src[r] * d, d, out + r * d);
  });
}

// out[dst[r]] += w[r] * y[r] for rows in order: parallel over column blocks,
// so every element adds its rows in the same order whatever the thread count.
void scatter_add_rows(const float* y, const float* w, const std::int64_t* dst, float* out, std::int64_t rows,
                      std::int64_t d) {
  constexpr std::int64_t kCols = 64;
  const std::int64_t blocks = (d + kCols - 1) / kCols;
  parallel_for(0, blocks, 1, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b) {
      const std::int64_t c0 = b * kCols, c1 = std::min(d, c0 + kCols);
      for (std::int64_t r = 0; r < rows; ++r) {
        const float wr = w ? w[r] : 1.0f;
        float* o = out + dst[r] * d;
        const float* yr = y + r * d;
        for (std::int64_t c = c0; c < c1; ++c) o[c] += wr * yr[c];
      }
    }
  });
}

// ---- CUDA: the same row movement with ops/moe_rows.h (the CPU's bits: same
// f32 arithmetic and order, one rounding to the output dtype).

// For every slot of `tokens` x `top_k`, its row in routing order or -1
// (dropped): the per-token row lists the combine sums over.
Tensor cuda_row_of_slot(const Tensor& slot_of_row, std::int64_t tokens, std::int64_t top_k, Device device) {
  return moe_row_of_slot(slot_of_row, tokens, top_k, device);
}

// out[t] = sum over token t's rows r, in row order, of w[r] * y[r] (w
// undefined: weight 1), in f32, rounded once to `dtype`.
Tensor cuda_sum_token_rows(const Tensor& y, const Tensor& w, const Tensor& row_of_slot, std::int64_t tokens,
                           std::int64_t top_k, DType dtype) {
  return moe_sum_token_rows(y, w, row_of_slot, tokens, top_k, dtype);
}

// out[r] = x[idx[r]] * w[r] (w undefined: weight 1), in f32, rounded once to `dtype`.
void cuda_gather_rows(const Tensor& out, const Tensor& x, const Tensor& idx, const Tensor& w) {
  moe_gather_rows_into(out, x, idx, w);
}

// moe_combine's gradients on CUDA: gy[r] = w[r] * g[tok[r]] (rounded to
// ydt), gw[r] = dot(g[tok[r]], y[r]) (rounded to wdt).
std::vector<Tensor> combine_backward_cuda(Node& n, const Tensor& grad, const Tensor& tok, DType ydt, DType wdt) {
  const std::int64_t r = tok.size(0), d = grad.size(1);
  Tensor gc = ops_detail::contiguous_detached(grad);
  Tensor gy, gw;
  if (n.needs_input_grad(0)) {
    gy = empty({r, d}, TensorOptions(ydt, grad.device()));
    cuda_gather_rows(gy, gc, tok, n.saved(1));
  }
  if (n.needs_input_grad(1)) {
    Tensor gwf = moe_row_dots(gc, tok, n.saved(0));
    gw = ops_detail::from_f32(gwf, wdt);
  }
  tls_counters.backward_bytes_moved += std::int64_t(grad.nbytes());
  return {gy, gw};
}

void check_rows_device(const char* op, const Tensor& a, const Tensor& b) {
  ops_detail::check_kernel_device(op, a);
  REMAT_CHECK(a.device() == b.device(), DeviceError, op, ": ", ops_detail::describe(a), " and ",
              ops_detail::describe(b), " are on different devices");
}

// The payload outlives the forward only when a backward will read it: then
// it comes from the leased pool; inside a checkpoint region (or a replay, or
// without grad) it is ordinary scratch.
Tensor payload_buffer(const Shape& sizes, DType dtype, Device device, bool needs_backward) {
  const bool in_region = current_save_region() >= 0 || in_recompute();
  if (needs_backward && !in_region) return DispatchBufferPool::for_device(device).lease(sizes, dtype);
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
  ops_detail::check_kernel_device("moe_dispatch", x);
  const bool dev = ops_detail::on_cuda(x);
  Tensor out = dispatch1("moe_dispatch", {x}, [&] {
    Tensor idx = routing.token_of_row.to(x.device()).contiguous();
    const bool keep = lease && grad_enabled() && x.requires_grad();
    Tensor o;
    if (dev) {
      o = payload_buffer({rows, d}, x.dtype(), x.device(), keep);
      cuda_gather_rows(o, x, idx, Tensor());
    } else {
      Tensor xf = ops_detail::f32_contiguous(x.detach());
      o = payload_buffer({rows, d}, DType::f32, x.device(), keep);
      gather_rows(xf.data<float>(), idx.data<std::int64_t>(), o.data<float>(), rows, d);
      if (x.dtype() != DType::f32) o = o.to(x.dtype());
    }
    if (auto node = autograd::make_node("moe_dispatch", {&x})) {
      // CUDA sums each token's gradient rows from its slots' rows.
      node->save(dev ? routing.slot_of_row.to(x.device()).contiguous() : idx);
      node->backward_fn = [tokens = routing.tokens, top_k = routing.top_k, d, dt = x.dtype(), dev](
                              Node& n, std::vector<Tensor>& g) {
        Tensor i = n.saved(0);
        if (dev) {
          Tensor gx = cuda_sum_token_rows(g[0], Tensor(), cuda_row_of_slot(i, tokens, top_k, g[0].device()), tokens,
                                          top_k, dt);
          tls_counters.backward_bytes_moved += std::int64_t(g[0].nbytes());
          return std::vector<Tensor>{gx};
        }
        Tensor gf = ops_detail::f32_contiguous(g[0]);
        Tensor gx = zeros({tokens, d});
        scatter_add_rows(gf.data<float>(), nullptr, i.data<std::int64_t>(), gx.data<float>(), i.size(0), d);
        tls_counters.backward_bytes_moved += std::int64_t(g[0].nbytes());
        return std::vector<Tensor>{ops_detail::from_f32(gx, dt)};
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
  const std::int64_t rows = routing.rows(), d = y.size(1), tokens = routing.tokens;
  REMAT_CHECK(y.dim() == 2 && y.size(0) == rows && row_weights.dim() == 1 && row_weights.size(0) == rows, ShapeError,
              "moe_combine: expected expert rows [", rows, ", d] and weights [", rows, "], got ",
              shape_str(y.sizes()), " and ", shape_str(row_weights.sizes()));
  check_rows_device("moe_combine", y, row_weights);
  const bool dev = ops_detail::on_cuda(y);
  count_move(rows, std::int64_t(y.nbytes()));
  return dispatch1("moe_combine", {y, row_weights}, [&] {
    Tensor idx = routing.token_of_row.to(y.device()).contiguous();
    Tensor out;
    if (dev) {
      out = cuda_sum_token_rows(y, row_weights, cuda_row_of_slot(routing.slot_of_row, tokens, routing.top_k, y.device()),
                                tokens, routing.top_k, y.dtype());
    } else {
      Tensor yf = ops_detail::f32_contiguous(y.detach());
      Tensor wf = ops_detail::f32_contiguous(row_weights.detach());
      out = zeros({tokens, d});
      scatter_add_rows(yf.data<float>(), wf.data<float>(), idx.data<std::int64_t>(), out.data<float>(), rows, d);
      out = ops_detail::from_f32(out, y.dtype());
    }
    if (auto node = autograd::make_node("moe_combine", {&y, &row_weights})) {
      node->save(node->needs_input_grad(1) ? y : Tensor());
      node->save(node->needs_input_grad(0) ? row_weights : Tensor());
      node->save(idx);
      node->backward_fn = [d, ydt = y.dtype(), wdt = row_weights.dtype(), dev](Node& n, std::vector<Tensor>& g) {
        Tensor i = n.saved(2);
        if (dev) return combine_backward_cuda(n, g[0], i, ydt, wdt);
        const std::int64_t* tok = i.data<std::int64_t>();
        const std::int64_t r = i.size(0);
        Tensor gf = ops_detail::f32_contiguous(g[0]);
        const float* go = gf.data<float>();
        Tensor gy, gw;
        if (n.needs_input_grad(0)) {
          Tensor w = ops_detail::f32_contiguous(n.saved(1));
          const float* wp = w.data<float>();
          gy = empty({r, d});
          float* p = gy.data<float>();
          ops_detail::parallel_rows(r, d, [&](std::int64_t r0, std::int64_t r1) {
            for (std::int64_t k = r0; k < r1; ++k)
              for (std::int64_t c = 0; c < d; ++c) p[k * d + c] = wp[k] * go[tok[k] * d + c];
          });
          gy = ops_detail::from_f32(gy, ydt);
        }
        if (n.needs_input_grad(1)) {
          Tensor yv = ops_detail::f32_contiguous(n.saved(0));
          const float* yp = yv.data<float>();
          gw = empty({r});
          float* p = gw.data<float>();
          ops_detail::parallel_rows(r, d, [&](std::int64_t r0, std::int64_t r1) {
            for (std::int64_t k = r0; k < r1; ++k) p[k] = ops_detail::lane_dot(go + tok[k] * d, yp + k * d, d);
          });
          gw = ops_detail::from_f32(gw, wdt);
        }
        tls_counters.backward_bytes_moved += std::int64_t(g[0].nbytes());
        return std::vector<Tensor>{gy, gw};
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

}  // namespace remat
