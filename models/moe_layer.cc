#include "models/moe_layer.h"

#include <algorithm>

#include "checkpoint/recompute_context.h"
#include "moe/router.h"
#include "ops/ops.h"

namespace remat {

MoELayer::MoELayer(const ModelConfig& c, std::int64_t layer, Generator& gen) : config_(c), layer_(layer) {
  gate = register_module("gate", std::make_shared<Linear>(c.d_model, c.experts, c.init_std, gen));
  for (std::int64_t e = 0; e < c.experts; ++e) {
    experts.push_back(register_module("experts." + std::to_string(e), std::make_shared<MLP>(c.d_model, c.moe_ffn, c.init_std, gen)));
  }
  if (c.shared > 0)
    shared_expert = register_module("shared_expert", std::make_shared<MLP>(c.d_model, c.moe_ffn * c.shared, c.init_std, gen));
  dispatcher = std::make_shared<LocalDispatcher>();
}

// Grouped expert compute: expert e runs once on its contiguous rows.
Tensor MoELayer::routed_experts(const Tensor& xp, const Routing& routing) const {
  std::vector<Tensor> parts;
  for (std::int64_t e = 0; e < config_.experts; ++e) {
    const std::int64_t n = routing.counts[std::size_t(e)];
    if (n == 0) continue;
    parts.push_back(experts[std::size_t(e)]->forward(xp.narrow(0, routing.offsets[std::size_t(e)], n)));
  }
  if (parts.empty()) return zeros({0, xp.size(1)}, TensorOptions(xp.dtype(), xp.device()));
  return parts.size() == 1 ? parts[0] : cat(parts, 0);
}

Tensor MoELayer::forward(const Tensor& x_in) const {
  return run_part(wrap, "moe", [this](const std::vector<Tensor>& in) {
    const Tensor& x = in[0];
    const std::int64_t B = x.size(0), S = x.size(1), d = x.size(2);
    Tensor t = x.reshape({B * S, d});
    RouterOptions ro;
    ro.top_k = config_.top_k;
    ro.random_routing = config_.random_routing;
    ro.compute_z_loss = config_.z_coef > 0;
    ro.expert_bias = expert_bias;
    RouterOutput r = route(t, gate->weight, ro);
    // Shared: the moe_expert region's replay (during backward) needs it too.
    const auto routing_ptr = std::make_shared<const Routing>(make_routing(r.indices, config_.experts, config_.capacity_factor));
    const Routing& routing = *routing_ptr;

    Tensor xp = dispatcher->dispatch(t, routing);
    // The routed-expert compute is the "moe_expert" region: its input (the
    // permuted rows) is kept; dispatch and combine stay outside it.
    Tensor yp = run_part(wrap, "moe_expert", [this, routing_ptr](const std::vector<Tensor>& v) {
      return std::vector<Tensor>{routed_experts(v[0], *routing_ptr)};
    }, {xp})[0];
    Tensor row_w = index_select(r.weights.reshape({-1}), 0, routing.slot_of_row);
    Tensor y = dispatcher->combine(yp, row_w.to(yp.dtype()), routing);
    if (shared_expert)
      y = add(y, run_part(wrap, "shared_experts", [this](const std::vector<Tensor>& v) {
        return std::vector<Tensor>{shared_expert->forward(v[0])};
      }, {t})[0]);

    once([&] {
      if (!sink) return;
      MoELayerStats st;
      st.layer = layer_;
      st.tokens_per_expert = r.slots_per_expert;
      const auto mx = *std::max_element(st.tokens_per_expert.begin(), st.tokens_per_expert.end());
      const double mean = double(B * S * config_.top_k) / double(config_.experts);
      st.imbalance = mean > 0 ? double(mx) / mean : 0.0;
      st.dropped = routing.dropped;
      st.aux = r.aux.item();
      st.z = r.z.defined() ? r.z.item() : 0.0;
      sink(r.aux, r.z, st);
    });
    return std::vector<Tensor>{y.reshape({B, S, d})};
  }, {x_in})[0];
}

}  // namespace remat
