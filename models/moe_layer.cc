#include "models/moe_layer.h"

#include <algorithm>
#include <any>
#include <functional>

#include "checkpoint/replay_memo.h"
#include "engine/recompute_context.h"
#include "models/block_stack.h"
#include "moe/router.h"
#include "ops/ops.h"

namespace remat {

RoutedExpertName routed_expert_name(const std::string& name) {
  for (const std::string key : {".mlp.experts.", ".block_sparse_moe.experts."}) {
    const std::size_t k = name.find(key);
    if (k == std::string::npos) continue;
    RoutedExpertName r;
    const std::size_t begin = k + key.size(), end = name.find('.', begin);
    const std::string layers = "model.layers.";
    const std::size_t l = name.rfind(layers, k);
    if (end == std::string::npos || end == begin || l == std::string::npos) return {};
    auto number = [&](std::size_t b, std::size_t e) -> std::int64_t {
      if (b >= e || e - b > 9) return -1;
      std::int64_t v = 0;
      for (std::size_t i = b; i < e; ++i) {
        if (name[i] < '0' || name[i] > '9') return -1;
        v = v * 10 + (name[i] - '0');
      }
      return v;
    };
    r.layer = number(l + layers.size(), k);
    r.expert = number(begin, end);
    if (r.layer < 0 || r.expert < 0) return {};
    r.at = begin;
    return r;
  }
  return {};
}

MoELayer::MoELayer(const ModelConfig& c, std::int64_t layer, Generator& gen, ExpertPlacement placement)
    : config_(c), layer_(layer) {
  REMAT_CHECK(placement.ranks >= 1 && placement.rank >= 0 && placement.rank < placement.ranks &&
                  c.experts % placement.ranks == 0,
              ShapeError, "MoE layer ", layer, ": ", c.experts, " experts cannot be placed on ", placement.ranks,
              " expert-parallel ranks (the expert count must divide by the ranks)");
  const std::int64_t per_rank = c.experts / placement.ranks;
  first_expert_ = placement.rank * per_rank;
  gate = register_module("gate", std::make_shared<Linear>(c.d_model, c.experts, c.init_std, gen));
  gate->adaptable = false;  // (route() reads its weight)
  const MLPNames names = c.arch == "mixtral" ? MLPNames::mixtral() : MLPNames{};
  for (std::int64_t e = 0; e < c.experts; ++e) {
    if (e >= first_expert_ && e < first_expert_ + per_rank) {
      experts.push_back(register_module("experts." + std::to_string(e),
                                        std::make_shared<MLP>(c.d_model, c.moe_ffn, c.init_std, gen, names)));
    } else {
      // Held by another rank: draw nothing, but advance the generator as
      // gate_proj, up_proj and down_proj would.
      for (int w = 0; w < 3; ++w) gen.reserve(std::uint64_t(c.d_model * c.moe_ffn));
    }
  }
  if (c.shared_hidden() > 0)
    shared_expert = register_module("shared_expert", std::make_shared<MLP>(c.d_model, c.shared_hidden(), c.init_std, gen));
  if (c.shared_gate)
    shared_expert_gate = register_module("shared_expert_gate", std::make_shared<Linear>(c.d_model, 1, c.init_std, gen));
  dispatcher = std::make_shared<LocalDispatcher>();
  batch = std::make_shared<BatchGroup>();
}

// Grouped expert compute: expert e runs once on its contiguous rows.
Tensor MoELayer::routed_experts(const Tensor& xp, const Routing& routing) const {
  std::vector<Tensor> parts;
  for (std::size_t e = 0; e < experts.size(); ++e) {
    const std::int64_t n = routing.expert_rows[e];
    if (n == 0) continue;
    parts.push_back(experts[e]->forward(xp.narrow(0, routing.expert_offsets[e], n)));
  }
  // No rows for any expert here: return the (empty) rows themselves, so the
  // result stays connected to the dispatch. Under expert parallelism every
  // rank must run the backward of every all_to_all, whatever its own rows.
  if (parts.empty()) return xp.narrow(0, 0, 0);
  return parts.size() == 1 ? parts[0] : cat(parts, 0);
}

namespace {

thread_local MoETerms* tls_terms = nullptr;

// A MoE layer's RoutingContext for one forward (or replay): the ranks that
// share the batch exchange their slot counts (a replay with metadata reuse
// takes the forward's exchange instead), and unless the routing is random
// the routes come from a replay memo, so a replay routes as the forward did
// (same routes, so the same dispatch and combine), whatever its boundary
// holds. The choice still runs in the replay (a top-k over [T, E], cheap),
// so the replay dispatches the same ops as the forward (selective policies
// count them); its result is replaced by the forward's. (Random routing
// needs no memo: the replay restores the RNG.)
class LayerRouting final : public RoutingContext {
 public:
  LayerRouting(BatchGroup& batch, std::int64_t layer, bool reuse_metadata, bool memo_routes)
      : batch_(batch), layer_(layer), reuse_metadata_(reuse_metadata), memo_routes_(memo_routes) {}

  bool global() const override { return batch_.ranks() > 1; }
  std::vector<std::int64_t> global_slots(const std::vector<std::int64_t>& local) override {
    auto exchange = [&] { return batch_.gather_counts(local); };
    const std::int64_t reused0 = replay_memos_reused();
    counts = reuse_metadata_ ? replay_memo<SlotCounts>("moe routing counts", exchange) : exchange();
    if (replay_memos_reused() > reused0) count_metadata_reuse(std::int64_t(local.size() * sizeof(std::int64_t)));
    REMAT_CHECK(counts.per_rank.at(counts.rank) == local, CheckpointMismatchError, "MoE layer ", layer_,
                ": the replay routed this rank's tokens differently from the forward, so the forward's "
                "exchanged counts cannot be reused");
    return counts.total();
  }
  Tensor global_sum(const Tensor& v) override { return batch_.sum(v); }
  Tensor select_indices(const std::function<Tensor()>& choose) override {
    if (!memo_routes_) return choose();
    Tensor fresh = choose();
    return replay_memo<Tensor>("moe routes", [&] { return fresh; });
  }

  // Every rank's slots per expert (set by global_slots).
  SlotCounts counts;

 private:
  BatchGroup& batch_;
  std::int64_t layer_;
  bool reuse_metadata_, memo_routes_;
};

}  // namespace

MoETermsScope::MoETermsScope(MoETerms& terms) : previous_(tls_terms) { tls_terms = &terms; }
MoETermsScope::~MoETermsScope() { tls_terms = previous_; }
MoETerms* MoETermsScope::current() { return tls_terms; }

namespace {
class MoETermsChannel final : public SideOutputChannel {
 public:
  struct Kept {
    std::size_t aux = 0;  // how many of the outputs are aux losses (the rest are z-losses)
    std::vector<MoELayerStats> stats;
  };
  std::vector<Tensor> capture(const std::function<void()>& run, std::any* keep) override {
    MoETerms local;
    local.replays = true;
    {
      MoETermsScope collect(local);
      run();
    }
    std::vector<Tensor> out = local.aux;
    out.insert(out.end(), local.z.begin(), local.z.end());
    if (keep) *keep = Kept{local.aux.size(), std::move(local.stats)};
    return out;
  }
  void emit(std::vector<Tensor> outputs, std::any kept) override {
    MoETerms* terms = MoETermsScope::current();
    if (!terms) return;
    Kept k = std::any_cast<Kept>(std::move(kept));
    REMAT_CHECK(k.aux <= outputs.size(), Error, "MoE terms: a reentrant region returned ", outputs.size(),
                " router losses, fewer than its ", k.aux, " aux losses");
    terms->aux.insert(terms->aux.end(), outputs.begin(), outputs.begin() + std::ptrdiff_t(k.aux));
    terms->z.insert(terms->z.end(), outputs.begin() + std::ptrdiff_t(k.aux), outputs.end());
    terms->stats.insert(terms->stats.end(), k.stats.begin(), k.stats.end());
  }
};
}  // namespace

std::shared_ptr<SideOutputChannel> moe_terms_channel() { return std::make_shared<MoETermsChannel>(); }

Tensor MoELayer::forward(const Tensor& x_in, const PartRunner& parts) const {
  return parts.run("moe", [this, &parts](const std::vector<Tensor>& in) {
    const Tensor& x = in[0];
    const std::int64_t B = x.size(0), S = x.size(1), d = x.size(2);
    return std::vector<Tensor>{moe_part(x.reshape({B * S, d}), parts).reshape({B, S, d})};
  }, {x_in})[0];
}

RouterOptions MoELayer::router_options() const {
  RouterOptions ro;
  ro.top_k = config_.top_k;
  ro.random_routing = config_.random_routing;
  ro.balanced_routing = config_.balanced_routing;
  ro.compute_z_loss = config_.z_coef > 0;
  ro.normalize_topk = config_.norm_topk;
  ro.expert_bias = expert_bias;
  return ro;
}

void MoELayer::check_dispatcher() const {
  REMAT_CHECK(dispatcher->first_expert(config_.experts) == first_expert_ &&
                  dispatcher->local_experts(config_.experts) == std::int64_t(experts.size()),
              Error, "MoE layer ", layer_, " holds experts [", first_expert_, ", ",
              first_expert_ + std::int64_t(experts.size()), ") but its dispatcher computes [",
              dispatcher->first_expert(config_.experts), ", ",
              dispatcher->first_expert(config_.experts) + dispatcher->local_experts(config_.experts), ")");
}

Tensor MoELayer::moe_part(const Tensor& t, const PartRunner& parts) const {
  const RouterOptions ro = router_options();
  check_dispatcher();
  // Every rank's slots per expert: exchanged between the ranks sharing the
  // batch (or, in a replay with metadata reuse, the forward's exchange).
  LayerRouting ctx(*batch, layer_, reuse_routing_metadata, !config_.random_routing);
  RouterOutput r = route(t, gate->weight, ro, ctx);
  if (batch->ranks() <= 1) ctx.counts.per_rank = {r.slots_per_expert};
  // Shared: the moe_expert region's replay (during backward) needs it too.
  const auto routing_ptr = std::make_shared<const Routing>(
      dispatcher->make_routing(r.indices, config_.experts, ctx.counts, config_.capacity_factor));
  const Routing& routing = *routing_ptr;

  Tensor xp = dispatcher->dispatch(t, routing);
  // The routed-expert compute is the "moe_expert" region: its input (the
  // permuted rows) is kept; dispatch and combine stay outside it.
  Tensor yp = parts.run("moe_expert", [this, routing_ptr](const std::vector<Tensor>& v) {
    return std::vector<Tensor>{routed_experts(v[0], *routing_ptr)};
  }, {xp})[0];
  Tensor row_w = index_select(r.weights.reshape({-1}), 0, routing.slot_of_row);
  Tensor y = dispatcher->combine(yp, row_w.to(yp.dtype()), routing);
  // The rows are saves from here on: held by no local, dynamic remat may
  // evict them while the shared expert runs.
  xp = Tensor();
  yp = Tensor();
  if (shared_expert)
    y = add(y, parts.run("shared_experts", [this](const std::vector<Tensor>& v) {
      return std::vector<Tensor>{shared_experts(v[0])};
    }, {t})[0]);
  report(r, routing);
  return y;
}

Tensor MoELayer::shared_experts(const Tensor& t) const {
  Tensor s = shared_expert->forward(t);
  if (shared_expert_gate) s = mul(s, sigmoid(shared_expert_gate->forward(t)));  // [T, 1] broadcast
  return s;
}

void MoELayer::report(const RouterOutput& r, const Routing& routing) const {
  MoETerms* terms = MoETermsScope::current();
  const bool replay = in_recompute();
  if (!terms || (replay && !terms->replays)) return;
  terms->aux.push_back(r.aux);
  if (r.z.defined()) terms->z.push_back(r.z);
  if (replay) return;  // a reentrant region's replay: its losses again, not the metrics
  MoELayerStats st;
  st.layer = layer_;
  st.tokens_per_expert = r.slots_per_expert;
  const auto mx = *std::max_element(st.tokens_per_expert.begin(), st.tokens_per_expert.end());
  std::int64_t all_slots = 0;
  for (auto c : st.tokens_per_expert) all_slots += c;
  const double mean = double(all_slots) / double(config_.experts);
  st.imbalance = mean > 0 ? double(mx) / mean : 0.0;
  st.dropped = routing.dropped;
  if (!r.aux.device().is_meta()) {  // meta: no values
    st.aux = r.aux.item();
    st.z = r.z.defined() ? r.z.item() : 0.0;
  }
  terms->stats.push_back(st);
}

}  // namespace remat
