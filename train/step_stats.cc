#include "train/step_stats.h"

#include <algorithm>
#include <utility>

#include "engine/json.h"

namespace remat {

namespace {
// A JSON object written in insertion order (engine/json.h sorts keys):
// numbers with 6 significant digits (integers exactly).
class OrderedJson {
 public:
  OrderedJson& set(const std::string& key, double v) { return set_raw(key, Json::format_number(v, 6)); }
  OrderedJson& set(const std::string& key, std::int64_t v) { return set(key, double(v)); }
  OrderedJson& set(const std::string& key, bool v) { return set_raw(key, v ? "true" : "false"); }
  OrderedJson& set_raw(const std::string& key, const std::string& json) {
    fields_.emplace_back(key, json);
    return *this;
  }
  std::string str() const {
    std::string out = "{";
    for (std::size_t i = 0; i < fields_.size(); ++i)
      out += (i ? ", " : "") + Json::quote(fields_[i].first) + ": " + fields_[i].second;
    return out + "}";
  }

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

// "[a, b, ...]" of the objects' texts.
std::string json_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out + "]";
}

std::string stages_json(const std::vector<PipelineStageStats>& stages) {
  std::vector<std::string> items;
  for (const PipelineStageStats& p : stages) {
    OrderedJson o;
    o.set("stage", p.stage).set("first_block", p.first_block).set("end_block", p.end_block);
    o.set("peak_allocated_bytes", p.peak_allocated_bytes).set("activation_bytes", p.activation_bytes);
    o.set("in_flight", p.in_flight).set("forward_ms", p.forward_ms).set("backward_ms", p.backward_ms);
    o.set("idle_ms", p.idle_ms).set("bubble", p.bubble()).set("sent_bytes", p.sent_bytes);
    items.push_back(o.str());
  }
  return json_list(items);
}

// Per phase: its calls and bytes, then each collective kind it used.
std::string comm_json(const CommCounters& c) {
  OrderedJson comm;
  for (CommPhase p : {CommPhase::forward, CommPhase::backward, CommPhase::replay}) {
    OrderedJson ph;
    ph.set("calls", c.calls_in(p)).set("bytes", c.bytes_in(p));
    for (std::size_t k = 0; k < kCollectiveKinds; ++k) {
      const auto kind = CollectiveKind(k);
      if (c.calls_of(kind, p) == 0) continue;
      OrderedJson one;
      one.set("calls", c.calls_of(kind, p)).set("bytes", c.bytes_of(kind, p));
      ph.set_raw(collective_name(kind), one.str());
    }
    comm.set_raw(phase_name(p), ph.str());
  }
  return comm.str();
}

// The MoE keys: per-layer routing metrics, the worst imbalance and the drops.
void set_routing(const StepStats& s, OrderedJson& j) {
  std::vector<std::string> layers;
  double worst = 0;
  std::int64_t dropped = 0;
  for (const MoELayerStats& r : s.routing) {
    std::string tpe = "[";
    for (std::size_t e = 0; e < r.tokens_per_expert.size(); ++e)
      tpe += (e ? "," : "") + std::to_string(r.tokens_per_expert[e]);
    OrderedJson l;
    l.set("layer", r.layer).set_raw("tokens_per_expert", tpe + "]").set("imbalance", r.imbalance);
    l.set("dropped", r.dropped).set("aux", r.aux).set("z_loss", r.z);
    layers.push_back(l.str());
    worst = std::max(worst, r.imbalance);
    dropped += r.dropped;
  }
  j.set("loss_aux", s.aux_loss).set("moe_imbalance_max", worst).set("moe_dropped", dropped);
  j.set("moved_bytes", s.moved_bytes).set("replayed_comm_bytes", s.replayed_comm_bytes);
  j.set_raw("moe", json_list(layers));
}
}  // namespace

std::string StepStats::to_json(const StepLogKeys& keys) const {
  OrderedJson j;
  j.set("step", step).set("loss", loss).set("lr", lr).set("grad_norm", grad_norm);
  j.set("tokens_per_s", tokens_per_s).set("step_ms", step_ms);
  if (keys.seq) j.set("seq", seq);
  j.set("peak_allocated_bytes", peak_allocated_bytes).set("peak_reserved_bytes", peak_reserved_bytes);
  j.set("persistent_bytes", persistent_bytes).set("activation_bytes", activation_bytes);
  j.set("recomputed_ops", recomputed_ops).set("saved_bytes_peak", saved_bytes_peak);
  j.set("offloaded_bytes", offloaded_bytes).set("offload_ms", offload_wait_ms);
  j.set("compressed_saved_bytes", compressed_saved_bytes);
  j.set("boundary_bytes", boundary_bytes);
  if (keys.dynamic) {
    j.set("memory_budget_bytes", memory_budget_bytes)
        .set("budget_headroom_bytes", memory_budget_bytes - peak_allocated_bytes);
    j.set("evictions", evictions).set("evicted_bytes", evicted_bytes);
    j.set("rebuilds", rebuilds).set("rebuild_ms", rebuild_ms);
  }
  if (keys.pipeline) {
    j.set("pipeline_in_flight", pipeline_in_flight);
    j.set_raw("pipeline_stages", stages_json(pipeline_stages));
  }
  j.set("skipped", skipped).set("skipped_steps", skipped_steps);
  j.set("loss_scale", loss_scale).set("overflow_steps", overflow_steps);
  if (keys.comm) {
    j.set_raw("comm", comm_json(comm));
    j.set("grad_buckets", grad_buckets).set("grad_buckets_overlapped", grad_buckets_overlapped);
    j.set("routing_metadata_saved_bytes", routing_metadata_saved_bytes);
  }
  if (val_loss) j.set("val_loss", *val_loss);
  if (!routing.empty())
    set_routing(*this, j);
  else if (keys.moe)
    j.set("loss_aux", aux_loss);  // (per-layer routing metrics stay on their stages)
  return j.str();
}

}  // namespace remat
