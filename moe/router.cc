#include "moe/router.h"

#include <algorithm>

#include "checkpoint/output_discard.h"
#include "engine/autograd.h"
#include "engine/rng.h"
#include "ops/ops.h"

namespace remat {

namespace {

// K distinct experts per token, uniformly at random (Philox from the default
// generator of x's device, drawn on the host: the same values on every
// device), best-first order by draw; the indices go to `device`.
Tensor random_indices(std::int64_t tokens, std::int64_t experts, std::int64_t k, Device device) {
  const RngState s = reserve_batch_draw(default_generator(device), std::uint64_t(tokens * experts));
  std::vector<float> u(static_cast<std::size_t>(tokens * experts));
  philox_fill_uniform(u.data(), tokens * experts, s);
  std::vector<std::int64_t> idx(static_cast<std::size_t>(tokens * k));
  std::vector<std::int64_t> order(static_cast<std::size_t>(experts));
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t e = 0; e < experts; ++e) order[std::size_t(e)] = e;
    const float* row = u.data() + t * experts;
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return row[a] > row[b]; });
    for (std::int64_t j = 0; j < k; ++j) idx[std::size_t(t * k + j)] = order[std::size_t(j)];
  }
  return from_vector<std::int64_t>(idx, {tokens, k}, device);
}

// Slot s to expert s mod E: K consecutive experts per token, so distinct.
std::vector<std::int64_t> balanced_routes(std::int64_t slots, std::int64_t experts) {
  std::vector<std::int64_t> idx(static_cast<std::size_t>(slots));
  for (std::int64_t s = 0; s < slots; ++s) idx[std::size_t(s)] = s % experts;
  return idx;
}

}  // namespace

std::vector<std::int64_t> host_routes(const Tensor& indices, std::int64_t experts) {
  if (indices.device().is_meta()) {
    mirror_host_read(indices, DType::i64);
    return balanced_routes(indices.numel(), experts);
  }
  return indices.to_vector<std::int64_t>();
}

RouterOutput route(const Tensor& x, const Tensor& router_weight, const RouterOptions& opts) {
  LocalRouting local;
  return route(x, router_weight, opts, local);
}

RouterOutput route(const Tensor& x, const Tensor& router_weight, const RouterOptions& opts, RoutingContext& context) {
  REMAT_CHECK(x.dim() == 2 && router_weight.dim() == 2 && x.size(1) == router_weight.size(1), ShapeError,
              "router: tokens must be [T, d] and the router weight [E, d]; got ", shape_str(x.sizes()), " and ",
              shape_str(router_weight.sizes()));
  const std::int64_t T = x.size(0), E = router_weight.size(0), K = opts.top_k;
  REMAT_CHECK(K >= 1 && K <= E, ShapeError, "router: top_k ", K, " must be in [1, ", E, "]");
  RouterOutput out;

  // Logits from an FP32 copy of x that is not kept for backward: the router
  // linear's save of it becomes a recipe, regenerated before its backward.
  // An f32 x is its own copy: the linear saves x itself, like any save (a
  // recipe would hold x where dynamic remat cannot evict it).
  Tensor logits;
  const Tensor w32 = router_weight.dtype() == DType::f32 ? router_weight : cast(router_weight, DType::f32);
  if (x.dtype() == DType::f32) {
    logits = linear(x, w32);
  } else {
    DiscardedOutput x32("router_cast", [](const std::vector<Tensor>& in) { return cast(in[0], DType::f32); }, {x});
    SavedTensorHooksScope scope(x32.hooks());
    logits = linear(x32.output(), w32);
  }
  out.probs = softmax(logits, -1);

  auto choose = [&]() -> Tensor {
    if (opts.random_routing) return random_indices(T, E, K, x.device());
    if (opts.balanced_routing) return from_vector<std::int64_t>(balanced_routes(T * K, E), {T, K}, x.device());
    NoGradGuard ng;
    Tensor scores = out.probs.detach();
    if (opts.expert_bias.defined()) scores = add(scores, opts.expert_bias.to(DType::f32).to(scores.device()));
    return topk(scores, K, -1, true).second;
  };
  out.indices = context.select_indices(choose);
  Tensor picked = gather(out.probs, 1, out.indices);
  out.weights = opts.normalize_topk ? div(picked, sum(picked, {1}, true)) : picked;

  // Load balance: f_e (a count, no gradient) and P_e (mean probability),
  // over the global batch when ranks share it.
  const bool global = context.global();
  out.slots_per_expert.assign(std::size_t(E), 0);
  for (std::int64_t e : host_routes(out.indices, E)) out.slots_per_expert[std::size_t(e)]++;
  if (global) out.slots_per_expert = context.global_slots(out.slots_per_expert);
  std::int64_t all_slots = 0;
  for (auto c : out.slots_per_expert) all_slots += c;
  const double all_tokens = double(all_slots) / double(K);
  std::vector<float> f(static_cast<std::size_t>(E));
  for (std::int64_t e = 0; e < E; ++e) f[std::size_t(e)] = float(double(out.slots_per_expert[std::size_t(e)]) / double(all_slots));
  Tensor p_mean = global ? div(context.global_sum(sum(out.probs, {0})), all_tokens) : mean(out.probs, {0});
  out.aux = mul(sum(mul(p_mean, from_vector<float>(f, {E}, p_mean.device()))), double(E));
  if (opts.compute_z_loss) {
    // logsumexp(logits) = logits[:, 0] - log_softmax(logits)[:, 0].
    Tensor lse = sub(logits.select(1, 0), log_softmax(logits, -1).select(1, 0));
    Tensor sq = mul(lse, lse);
    out.z = global ? div(context.global_sum(sum(sq)), all_tokens) : mean(sq);
  }
  return out;
}

}  // namespace remat
