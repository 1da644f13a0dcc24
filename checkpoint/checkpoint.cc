#include "checkpoint/checkpoint.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <sstream>

#include "checkpoint/policy.h"
#include "checkpoint/replay_memo.h"
#include "engine/autograd.h"
#include "engine/device_runtime.h"
#include "engine/op_hooks.h"
#include "engine/rng.h"

namespace remat {

namespace {

thread_local CheckpointCounters tls_counters;
std::atomic<std::int64_t> g_region_id{0};

// Policies of the regions active on this thread, innermost last.
thread_local std::vector<const Policy*> tls_policies;

// The decision for `op` under the innermost region's policy; a `prefer_*`
// gives way to a `must_*` of an enclosing region.
SaveDecision decide(const Policy* own, const std::string& op) {
  SaveDecision d = own && *own ? (*own)(op) : SaveDecision::prefer_recompute;
  if (d == SaveDecision::must_save || d == SaveDecision::must_recompute) return d;
  for (auto it = tls_policies.rbegin(); it != tls_policies.rend(); ++it) {
    if (*it == own || !*it || !**it) continue;
    const SaveDecision outer = (**it)(op);
    if (outer == SaveDecision::must_save || outer == SaveDecision::must_recompute) return outer;
  }
  return d;
}

class PolicyScope {
 public:
  explicit PolicyScope(const Policy* p) { tls_policies.push_back(p); }
  ~PolicyScope() { tls_policies.pop_back(); }
  PolicyScope(const PolicyScope&) = delete;
  PolicyScope& operator=(const PolicyScope&) = delete;
};

std::uint64_t checksum_of(const Tensor& t) {
  Tensor c = t.detach().to(kCPU).contiguous();
  const auto* p = static_cast<const unsigned char*>(c.raw_data());
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the bytes
  for (std::size_t i = 0; i < c.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::string describe_meta(const char* op, const TensorMeta& m) {
  std::ostringstream os;
  os << "op '" << op << "' " << shape_str(m.sizes) << ' ' << m.dtype;
  return os.str();
}

// The RNG state of every device at region entry, restorable for a replay.
struct RngStash {
  RngState cpu;
  std::vector<RngState> cuda;

  static RngStash capture() {
    RngStash s;
    s.cpu = default_generator(kCPU).state();
    for (int d = 0; d < cuda_device_count(); ++d) s.cuda.push_back(default_generator(cuda_device(d)).state());
    return s;
  }
  void restore() const {
    default_generator(kCPU).set_state(cpu);
    for (std::size_t d = 0; d < cuda.size(); ++d) default_generator(cuda_device(int(d))).set_state(cuda[d]);
  }
};

// Swaps the stashed RNG state in for a replay and puts the current one back
// afterwards, so a replay never disturbs the random stream of the rest.
class RngSwap {
 public:
  explicit RngSwap(const RngStash& stashed) : current_(RngStash::capture()) { stashed.restore(); }
  ~RngSwap() { current_.restore(); }
  RngSwap(const RngSwap&) = delete;
  RngSwap& operator=(const RngSwap&) = delete;

 private:
  RngStash current_;
};

// Inputs for a replay: aliases of the boundary inputs, requiring grad where
// the originals did (so the replayed ops save what the original ones saved).
std::vector<Tensor> replay_inputs(const std::vector<Tensor>& inputs, const std::vector<bool>& requires_grad) {
  std::vector<Tensor> out;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined()) {
      out.push_back(t);
      continue;
    }
    Tensor d = t.detach();
    if (requires_grad[i]) d.set_requires_grad(true);
    out.push_back(d);
  }
  return out;
}

std::vector<bool> requires_grad_of(const std::vector<Tensor>& inputs) {
  std::vector<bool> r;
  for (const Tensor& t : inputs) r.push_back(t.defined() && t.requires_grad());
  return r;
}

struct StopReplay {};

// The op name of a non-reentrant region's boundary saves.
constexpr const char* kBoundaryOp = "checkpoint_boundary";
bool is_boundary(const SaveInfo& info) { return std::strcmp(info.op, kBoundaryOp) == 0; }

// ---------------------------------------------------------------------------
// Non-reentrant regions

class Region;

struct Placeholder {
  std::shared_ptr<Region> region;
  std::size_t index;
};

class Region : public std::enable_shared_from_this<Region> {
 public:
  struct Slot {
    SaveInfo info;
    std::uint64_t checksum = 0;
    bool pending = true;  // its SavedTensor is still alive
    Tensor value;         // regenerated, waiting for its consumer
  };

  // The boundary inputs are saved tensors of op "checkpoint_boundary", made
  // before the region's own hooks are pushed: hooks outside the region
  // (offload, compression) pack them, enclosing regions let them by.
  Region(RegionFn f, const std::vector<Tensor>& in, CheckpointOptions o)
      : id(++g_region_id), opts(std::move(o)), fn(std::move(f)), input_requires_grad(requires_grad_of(in)) {
    RegionScope scope(id);  // the registry counts a boundary under its own region
    for (const auto& t : in) boundary.push_back(std::make_unique<SavedTensor>(t, kBoundaryOp, false));
    holding_boundary = true;
  }

  ~Region() {
    free_boundary();
    for (auto& s : slots) drop_value(s);
  }

  // The regenerated tensor of slot i (replaying if needed); the region lets
  // go of it, so it dies with its consumer.
  Tensor take(std::size_t i) {
    if (!slots.at(i).value.defined()) replay();
    Slot& s = slots.at(i);
    REMAT_CHECK(s.value.defined(), CheckpointMismatchError, "checkpoint region '", opts.name, "' (id ", id,
                "): the replay did not regenerate saved tensor #", i, " (", describe_meta(s.info.op, s.info.meta), ")");
    Tensor t = s.value;
    drop_value(s);
    return t;
  }

  // The SavedTensor of slot i is gone: nothing needs it any more.
  void release(std::size_t i) {
    Slot& s = slots.at(i);
    if (!s.pending) return;
    s.pending = false;
    drop_value(s);
    if (--pending_count == 0) free_boundary();
  }

  std::size_t add_slot(const SaveInfo& info, const Tensor& t) {
    Slot s;
    s.info = info;
    if (opts.checksum) s.checksum = checksum_of(t);
    slots.push_back(std::move(s));
    ++pending_count;
    return slots.size() - 1;
  }

  // Lets go of the boundary inputs and cached outputs once no replay can be
  // needed any more.
  void free_boundary() {
    if (!holding_boundary) return;
    for (auto& b : boundary) b->release();
    holding_boundary = false;
    boundary.clear();
    for (auto& c : cached) drop_cached(c);
    cached.clear();
  }

  // After the region's forward: outputs written in place later inside the
  // forward no longer hold the op's result, so their ops are recomputed.
  void drop_stale_cache() {
    for (auto& c : cached)
      if (c.stale()) drop_cached(c);
  }

  void replay();

  // The outputs a policy kept of one top-level op of the region, with the
  // versions they had when kept.
  struct Cached {
    const char* op = "";
    std::vector<Tensor> outputs;
    std::vector<std::uint64_t> versions;
    bool empty() const { return outputs.empty(); }
    bool stale() const {
      for (std::size_t i = 0; i < outputs.size(); ++i)
        if (outputs[i].defined() && outputs[i].version() != versions[i]) return true;
      return false;
    }
  };
  // Cached outputs by top-level op index (empty where nothing is kept).
  std::vector<Cached> cached;

  std::int64_t id;
  CheckpointOptions opts;
  RegionFn fn;
  std::vector<std::unique_ptr<SavedTensor>> boundary;
  std::vector<bool> input_requires_grad;
  bool holding_boundary = false;
  RngStash rng;
  MemoLog memos;  // replay_memo() values of the original forward
  std::vector<Slot> slots;
  std::int64_t pending_count = 0;

 private:
  void drop_value(Slot& s) {
    if (!s.value.defined()) return;
    saved_bytes_release(s.value, "recompute", id);
    s.value = Tensor();
  }
  void drop_cached(Cached& c) {
    for (auto& t : c.outputs) saved_bytes_release(t, "checkpoint_cache", id);
    c = Cached{};
  }
  friend class HarvestHooks;
};

// Forward hooks of a region: saves become placeholders (unless the policy
// keeps them); unpack regenerates.
class RegionHooks final : public TypedSavedTensorHooks {
 public:
  explicit RegionHooks(std::shared_ptr<Region> r) : region_(std::move(r)) {}

  std::string name() const override { return "checkpoint region '" + region_->opts.name + "'"; }

  // Only tensors (an inner region's placeholder passes by), and not an inner
  // region's boundary: that region keeps it itself.
  bool wants(const Tensor&, const SaveInfo& info) const override { return !is_boundary(info); }

  std::any pack_tensor(const Tensor& t, const SaveInfo& info) override {
    return Placeholder{region_, region_->add_slot(info, t)};
  }

  Tensor unpack_tensor(std::any packed, const SaveInfo&) override {
    const auto& p = std::any_cast<const Placeholder&>(packed);
    return p.region->take(p.index);
  }

  std::size_t held_bytes(const std::any&) const override { return 0; }

  void on_release(const std::any& packed, const SaveInfo&) override {
    const auto& p = std::any_cast<const Placeholder&>(packed);
    p.region->release(p.index);
  }

 private:
  std::shared_ptr<Region> region_;
};

// Replay hooks: hand each save, in order, to its slot; stop early once every
// slot still needed has its tensor.
class HarvestHooks final : public TypedSavedTensorHooks {
 public:
  HarvestHooks(Region& r, std::int64_t missing) : r_(r), missing_(missing) {}

  std::string name() const override { return "replay of checkpoint region '" + r_.opts.name + "'"; }

  // As RegionHooks: inner regions' boundaries had no slot in the forward.
  bool wants(const Tensor&, const SaveInfo& info) const override { return !is_boundary(info); }

  std::any pack_tensor(const Tensor& tensor, const SaveInfo& info) override {
    const Tensor* t = &tensor;
    const std::size_t k = next_++;
    REMAT_CHECK(k < r_.slots.size(), CheckpointMismatchError, "checkpoint region '", r_.opts.name, "' (id ", r_.id,
                "): the replay saved more tensors than the original forward (", r_.slots.size(), "); extra save #", k,
                " from ", describe_meta(info.op, info.meta),
                ". The region's function must run the same ops when replayed");
    Region::Slot& s = r_.slots[k];
    if (r_.opts.determinism_check) {
      const bool same = std::strcmp(s.info.op, info.op) == 0 && s.info.meta.sizes == info.meta.sizes &&
                        s.info.meta.dtype == info.meta.dtype;
      REMAT_CHECK(same, CheckpointMismatchError, "checkpoint region '", r_.opts.name, "' (id ", r_.id,
                  "): save #", k, " of the replay is ", describe_meta(info.op, info.meta),
                  " but the original forward saved ", describe_meta(s.info.op, s.info.meta),
                  " there. The region's function must run the same ops on the same shapes when replayed "
                  "(random ops draw from the RNG state the region restores)");
      if (r_.opts.checksum)
        REMAT_CHECK(checksum_of(*t) == s.checksum, CheckpointMismatchError, "checkpoint region '", r_.opts.name,
                    "' (id ", r_.id, "): save #", k, " (", describe_meta(info.op, info.meta),
                    ") has different values in the replay than in the original forward");
    }
    if (s.pending && !s.value.defined()) {
      s.value = *t;
      saved_bytes_hold(s.value, "recompute", r_.id);
      tls_counters.tensors_regenerated++;
      tls_counters.bytes_regenerated += std::int64_t(t->nbytes());
      --missing_;
    }
    // Early stop: nothing after this point is needed.
    if (r_.opts.early_stop && missing_ == 0) throw StopReplay{};
    return std::any();
  }

  // The replay's own graph is dropped unused, so its saves are never unpacked.
  Tensor unpack_tensor(std::any, const SaveInfo& info) override {
    throw AutogradError("checkpoint region '" + r_.opts.name + "': a save of op '" + info.op +
                        "' made during its replay was unpacked; replays keep no saves");
  }
  std::size_t held_bytes(const std::any&) const override { return 0; }

  std::size_t saves_seen() const { return next_; }
  std::int64_t missing() const { return missing_; }

 private:
  Region& r_;
  std::int64_t missing_;
  std::size_t next_ = 0;
};

// Selective policies: in forward, caches the outputs of the ops the policy
// keeps (top-level ops of the region, numbered in order) among those that can
// take cached outputs (replay_cacheable_ops()); in the replay, hands them back
// so those ops skip their kernels (their autograd recording and saves still
// happen, so the replay's saves line up with the forward's). A cached output
// written in place since it was kept is an error, as for a saved tensor.
class CacheHook final : public OpHook {
 public:
  CacheHook(Region& r, bool replaying) : r_(r), replaying_(replaying) {}

  std::optional<std::vector<Tensor>> before(const OpCall&) override {
    if (depth_++ == 0) ++index_;
    return std::nullopt;
  }

  std::optional<std::vector<Tensor>> cached_outputs(const OpCall& call) override {
    const std::size_t k = std::size_t(index_);
    if (!replaying_ || depth_ != 1 || k >= r_.cached.size() || r_.cached[k].empty()) return std::nullopt;
    const Region::Cached& c = r_.cached[k];
    for (std::size_t i = 0; i < c.outputs.size(); ++i) {
      const Tensor& t = c.outputs[i];
      REMAT_CHECK(!t.defined() || t.version() == c.versions[i], AutogradError, "checkpoint region '", r_.opts.name,
                  "' (id ", r_.id, "): output #", i, " of ", describe_meta(c.op, TensorMeta{t.sizes(), t.dtype(), t.device()}),
                  ", kept by the region's selective policy for the replay, was modified in place after the "
                  "region's forward (kept at version ", c.versions[i], ", now version ", t.version(),
                  "); clone it before the in-place op, or leave '", c.op, "' out of the policy");
    }
    REMAT_CHECK(std::strcmp(c.op, call.name) == 0, CheckpointMismatchError, "checkpoint region '", r_.opts.name,
                "' (id ", r_.id, "): top-level op #", k, " of the replay is '", call.name,
                "' but the original forward ran '", c.op,
                "' there. The region's function must run the same ops when replayed");
    std::vector<Tensor> out;
    for (const Tensor& t : c.outputs) out.push_back(t.defined() ? t.detach() : t);
    return out;
  }

  // Counted here, where the op takes the cached outputs: only real skips.
  void cached_outputs_taken(const OpCall&) override { tls_counters.ops_skipped++; }

  void after(const OpCall& call, const std::vector<Tensor>& outputs) override {
    if (--depth_ > 0 || replaying_) return;
    if (!replay_cacheable(call.name) || !saves(decide(&r_.opts.policy, call.name))) return;
    const std::size_t k = std::size_t(index_);
    if (r_.cached.size() <= k) r_.cached.resize(k + 1);
    Region::Cached& c = r_.cached[k];
    c.op = call.name;
    for (const Tensor& t : outputs) {
      c.outputs.push_back(t.defined() ? t.detach() : t);
      c.versions.push_back(t.defined() ? t.version() : 0);
      saved_bytes_hold(c.outputs.back(), "checkpoint_cache", r_.id);
    }
  }

 private:
  Region& r_;
  bool replaying_;
  int depth_ = 0;
  std::int64_t index_ = -1;
};

// Adds the wall time of an outermost replay to the counters.
class ReplayTimer {
 public:
  ReplayTimer() : outermost_(!in_recompute()), t0_(std::chrono::steady_clock::now()) {}
  ~ReplayTimer() {
    if (outermost_)
      tls_counters.replay_ns +=
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_).count();
  }
  ReplayTimer(const ReplayTimer&) = delete;
  ReplayTimer& operator=(const ReplayTimer&) = delete;

 private:
  bool outermost_;
  std::chrono::steady_clock::time_point t0_;
};

void Region::replay() {
  ReplayTimer timer;
  RecomputeScope replaying;
  CategoryScope cat(MemoryCategory::recompute);
  tls_counters.replays++;
  std::int64_t missing = 0;
  for (const auto& s : slots)
    if (s.pending && !s.value.defined()) ++missing;
  // (A region may have no tensor inputs at all: what it holds is the state.)
  REMAT_CHECK(holding_boundary, CheckpointMismatchError, "checkpoint region '", opts.name, "' (id ", id,
              "): its boundary inputs were already released");
  auto harvest = std::make_shared<HarvestHooks>(*this, missing);
  const std::int64_t ops0 = ops_called();
  bool stopped = false;
  {
    RngSwap rng_swap(rng);
    MemoReplayScope memo(memos);
    EnableGradGuard grad_on;
    std::vector<Tensor> saved;
    for (const auto& b : boundary) saved.push_back(b->unpack());  // version-checked
    std::vector<Tensor> in = replay_inputs(saved, input_requires_grad);
    SavedTensorHooksScope hooks(harvest);
    RegionScope region(id);
    PolicyScope policy_scope(&opts.policy);
    std::optional<OpHookScope> cache;
    if (opts.policy) cache.emplace(std::make_shared<CacheHook>(*this, /*replaying=*/true));
    try {
      fn(in);
    } catch (const StopReplay&) {
      stopped = true;
    }
  }
  tls_counters.ops_recomputed += ops_called() - ops0;
  if (stopped) tls_counters.early_stops++;
  REMAT_CHECK(stopped || harvest->missing() == 0, CheckpointMismatchError, "checkpoint region '", opts.name, "' (id ",
              id, "): the replay saved ", harvest->saves_seen(), " tensors but the original forward saved ",
              slots.size(), ". The region's function must run the same ops when replayed");
}

// ---------------------------------------------------------------------------
// Reentrant regions

// The forward of a reentrant region: grad on (so its outputs learn whether
// they depend on parameters) but keeping no saved tensor. Only a tensor that
// left the region some other way than its outputs can reach these saves.
class DropAll final : public TypedSavedTensorHooks {
 public:
  explicit DropAll(std::string region) : region_(std::move(region)) {}
  std::string name() const override { return "forward of reentrant checkpoint region '" + region_ + "'"; }
  std::any pack_tensor(const Tensor&, const SaveInfo&) override { return std::any(); }
  Tensor unpack_tensor(std::any, const SaveInfo& info) override {
    throw AutogradError("reentrant checkpoint region '" + region_ + "': backward reached a save of op '" + info.op +
                        "' from its forward, which keeps none: a tensor made inside the region left it other "
                        "than as an output (a side output such as an auxiliary loss), and a reentrant region "
                        "differentiates only its outputs; return it as an output or use the non-reentrant default");
  }
  std::size_t held_bytes(const std::any&) const override { return 0; }

 private:
  std::string region_;
};

// The node a reentrant region records. Its saves are the boundary inputs,
// made before the region's forward as a non-reentrant region's are (op
// "checkpoint_boundary": hooks around the region, offload or compression,
// pack them; enclosing regions let them by).
class ReentrantNode final : public Node {
 public:
  ReentrantNode() : Node("checkpoint_reentrant") {}
  void adopt_saves(std::vector<std::unique_ptr<SavedTensor>> saves) {
    for (auto& s : saves) saved_.push_back(std::move(s));
  }
};

// What a reentrant region's backward needs besides its node.
struct ReentrantReplay {
  RegionFn fn;
  RngStash rng;
  std::shared_ptr<MemoLog> memos;
  std::vector<std::size_t> grad_outputs;  // the outputs that carry history, in the node's output order
  std::vector<bool> input_requires_grad;
  std::string name;

  // Replays the region from the node's saved boundary inputs with grad on
  // and differentiates the replayed outputs that carry history, seeded with
  // the node's output gradients. That accumulates into the .grad of every
  // leaf inside the region (its parameters), whether or not any boundary
  // input requires grad; returns the boundary inputs' gradients.
  std::vector<Tensor> operator()(Node& self, std::vector<Tensor>& grads) const {
    REMAT_CHECK(backward_mode() != BackwardMode::grad, AutogradError, "reentrant checkpoint region '", name,
                "' cannot run under grad(): its replay accumulates into .grad; use the non-reentrant default");
    const std::size_t n_in = input_requires_grad.size();
    std::vector<Tensor> saved;
    for (std::size_t i = 0; i < n_in; ++i) saved.push_back(self.saved(i));  // version-checked
    std::optional<ReplayTimer> timer(std::in_place);  // the replayed forward only
    tls_counters.replays++;
    const std::int64_t ops0 = ops_called();
    std::vector<Tensor> in, outs;
    {
      // The replay is a recompute; the backward after it is the region's
      // own (gradient hooks, collectives and once() see a backward).
      RecomputeScope replaying;
      CategoryScope cat(MemoryCategory::recompute);
      RngSwap rng_swap(rng);
      MemoReplayScope memo(*memos);
      EnableGradGuard grad_on;
      in = replay_inputs(saved, input_requires_grad);
      outs = fn(in);
    }
    tls_counters.ops_recomputed += ops_called() - ops0;
    timer.reset();
    REMAT_CHECK(outs.size() > (grad_outputs.empty() ? 0 : grad_outputs.back()), CheckpointMismatchError,
                "reentrant checkpoint region '", name, "': the replay returned ", outs.size(),
                " outputs, fewer than the original forward's");
    std::vector<Tensor> roots, seeds;
    for (std::size_t j = 0; j < grad_outputs.size(); ++j) {
      const Tensor& o = outs[grad_outputs[j]];
      if (o.defined() && o.requires_grad()) {
        roots.push_back(o);
        seeds.push_back(grads[j]);
      }
    }
    if (!roots.empty()) remat::backward(roots, seeds);
    std::vector<Tensor> gi;
    for (std::size_t i = 0; i < n_in; ++i) gi.push_back(self.needs_input_grad(i) ? in[i].grad() : Tensor());
    return gi;
  }
};

std::vector<Tensor> checkpoint_reentrant(const RegionFn& fn, const std::vector<Tensor>& inputs,
                                         const CheckpointOptions& opts) {
  ReentrantReplay replay{fn, RngStash::capture(), std::make_shared<MemoLog>(), {}, requires_grad_of(inputs),
                         opts.name};
  std::vector<std::unique_ptr<SavedTensor>> boundary;
  for (const Tensor& t : inputs) boundary.push_back(std::make_unique<SavedTensor>(t, kBoundaryOp, false));
  std::vector<Tensor> outs;
  {
    SavedTensorHooksScope drop(std::make_shared<DropAll>(opts.name));
    MemoRecordScope record(*replay.memos);
    outs = fn(inputs);
  }
  // The outputs as new tensors; those that depend on something requiring
  // grad (an input or a parameter inside) get the node as their history.
  std::vector<Tensor> result;
  result.reserve(outs.size());
  for (std::size_t i = 0; i < outs.size(); ++i) {
    result.push_back(outs[i].defined() ? outs[i].detach() : outs[i]);
    if (outs[i].defined() && outs[i].requires_grad()) replay.grad_outputs.push_back(i);
  }
  if (replay.grad_outputs.empty()) return result;  // nothing to differentiate: no node
  auto node = std::make_shared<ReentrantNode>();
  for (const Tensor& t : inputs) node->next_edges.push_back(t.defined() ? autograd::gradient_edge(t) : Edge{});
  node->adopt_saves(std::move(boundary));
  std::vector<Tensor*> with_history;
  for (std::size_t i : replay.grad_outputs) with_history.push_back(&result[i]);
  node->backward_fn = std::move(replay);
  autograd::set_history(with_history, node);
  return result;
}

}  // namespace

std::vector<Tensor> checkpoint(const RegionFn& fn, const std::vector<Tensor>& inputs, const CheckpointOptions& opts) {
  REMAT_CHECK(!opts.reentrant || !opts.policy, Error, "checkpoint region '", opts.name,
              "': a reentrant region takes no selective policy (its replay runs every op again and keeps no "
              "cached output); use the non-reentrant default for a policy");
  if (!grad_enabled()) return fn(inputs);
  if (!in_recompute()) tls_counters.regions++;
  if (opts.reentrant) return checkpoint_reentrant(fn, inputs, opts);
  auto region = std::make_shared<Region>(fn, inputs, opts);
  region->rng = RngStash::capture();
  std::vector<Tensor> outs;
  {
    SavedTensorHooksScope hooks(std::make_shared<RegionHooks>(region));
    MemoRecordScope memo(region->memos);
    RegionScope scope(region->id);
    PolicyScope policy_scope(&region->opts.policy);
    std::optional<OpHookScope> cache;
    if (region->opts.policy) cache.emplace(std::make_shared<CacheHook>(*region, /*replaying=*/false));
    outs = fn(inputs);
  }
  region->drop_stale_cache();
  if (region->pending_count == 0) region->free_boundary();  // nothing to regenerate
  return outs;
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input, const CheckpointOptions& opts) {
  // `fn` runs again during backward: the region keeps its own copy.
  return checkpoint([fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0])}; },
                    std::vector<Tensor>{input}, opts)[0];
}

CheckpointCounters checkpoint_counters() { return tls_counters; }
void reset_checkpoint_counters() { tls_counters = CheckpointCounters{}; }

}  // namespace remat
