// Dynamic rematerialization: the records of the forward's calls, the
// handles saves are packed into, eviction under the budget and rebuilds.
#include "checkpoint/dynamic_remat.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

#include "engine/grad_mode.h"
#include "engine/recompute_context.h"

namespace remat {

namespace {

// Where a tensor lies in its storage.
struct View {
  Shape sizes, strides;
  std::int64_t offset = 0;
  DType dtype = DType::f32;
  static View of(const Tensor& t) { return {t.sizes(), t.strides(), t.storage_offset(), t.dtype()}; }
  bool operator==(const View&) const = default;
};

struct Record;

// One storage a recorded call produced.
struct Entry {
  std::uint64_t id = 0;
  std::shared_ptr<Record> producer;
  std::size_t result = 0;                // which of the producer's results
  std::weak_ptr<Storage> weak;           // the storage while it lives
  std::shared_ptr<Storage> strong;       // held while saves reference it and it is resident
  View base;                             // the producer's result in it
  std::shared_ptr<VersionCounter> version;
  std::uint64_t version_at_record = 0;
  std::int64_t bytes = 0;
  MemoryCategory category = MemoryCategory::activation;
  std::int64_t saves = 0;                // live handles
  bool cached = false;                   // a rebuilt result no save holds, kept for the rebuilds still to come
  std::uint64_t last_access = 0;
  std::uint64_t next_use = 0;            // the latest call that read it (its producer's until one did)
  std::vector<std::weak_ptr<Record>> consumers;
  std::int64_t cls = -1;                 // evicted equivalence class (this generation)
  std::uint64_t cls_generation = 0;
  const char* holder = "";               // the op of its first save (the saved-bytes registry)
  std::int64_t region = -1;

  bool resident() const { return !weak.expired(); }
};

// One recorded call.
struct Record {
  const char* op = "";
  RecomputeFn fn;  // null: not computed again (a collective)
  struct Input {
    std::shared_ptr<Entry> entry;  // a recorded storage, with the view the call read
    View view;
    std::uint64_t version = 0;
    Tensor pinned;                 // else the tensor itself (detached), or undefined
  };
  std::vector<Input> inputs;
  std::vector<std::weak_ptr<Entry>> results;
  std::vector<RngState> draws;
  std::int64_t ns = 0;
  std::uint64_t seq = 0;  // recording order
  MemoryCategory category = MemoryCategory::activation;  // its results' (a rebuild allocates under it)
};

Tensor tensor_over(const std::shared_ptr<Storage>& st, const View& v, const std::shared_ptr<VersionCounter>& version) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = st;
  impl->sizes = v.sizes;
  impl->strides = v.strides;
  impl->offset = v.offset;
  impl->dtype = v.dtype;
  impl->version = version;
  return Tensor(std::move(impl));
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct DynamicRemat::Core final : ProducerObserver, MemoryPressureHandler,
                                  std::enable_shared_from_this<DynamicRemat::Core> {
  explicit Core(DynamicRematOptions o) : opts(o) {}

  DynamicRematOptions opts;
  DynamicRematStats stats;
  std::uint64_t next_id = 0, clock = 0, generation = 1;
  std::unordered_map<const Storage*, std::shared_ptr<Entry>> by_storage;
  std::size_t purge_at = 4096;
  std::map<std::uint64_t, Entry*> candidates;  // resident entries with saves, by id (deterministic order)
  std::multiset<std::uint64_t> held_uses;       // next_use of every entry with saves, resident or not
  struct Class {
    std::int64_t parent;
    std::int64_t cost;
  };
  std::vector<Class> classes;

  // ---- lookup and recording

  std::shared_ptr<Entry> entry_of(const Tensor& t) const {
    if (!t.defined()) return nullptr;
    const Storage* s = t.impl().storage.get();
    auto it = by_storage.find(s);
    if (it == by_storage.end()) return nullptr;
    auto live = it->second->weak.lock();
    return live.get() == s ? it->second : nullptr;
  }

  void purge() {
    for (auto it = by_storage.begin(); it != by_storage.end();)
      it = it->second->weak.expired() ? by_storage.erase(it) : std::next(it);
    purge_at = std::max<std::size_t>(4096, by_storage.size() * 2);
  }

  void produced(const ProducedCall& call, RecomputeFn fn) override {
    ++stats.recorded_calls;
    if (by_storage.size() >= purge_at) purge();
    auto rec = std::make_shared<Record>();
    rec->op = call.op;
    rec->fn = std::move(fn);
    rec->draws = call.draws;
    rec->ns = std::max<std::int64_t>(1, call.ns);
    rec->seq = std::uint64_t(stats.recorded_calls);
    rec->category = current_category();
    if (!opts.device)
      for (const Tensor& t : *call.results)
        if (t.defined()) {
          opts.device = t.device();
          break;
        }
    for (const Tensor& t : *call.inputs) {
      rec->inputs.push_back(input_of(t, rec));
      if (rec->inputs.back().entry) set_next_use(*rec->inputs.back().entry, rec->seq);
    }
    rec->results.resize(call.results->size());
    if (!rec->fn) return;  // a collective's results stay plain tensors (pinned where a record needs them)
    for (std::size_t k = 0; k < call.results->size(); ++k) {
      const Tensor& t = (*call.results)[k];
      if (!t.defined() || !t.impl().storage) continue;
      const Storage* s = t.impl().storage.get();
      // Not the call's product: an input (or its view) handed back, or a
      // tensor its attributes held (a dispatch's row index). An entry for it
      // would keep the record, whose function holds that tensor, alive for
      // as long as the tensor lives: for ever.
      if (entry_of(t) || s->serial() < call.first_serial) continue;
      auto e = std::make_shared<Entry>();
      e->id = ++next_id;
      e->producer = rec;
      e->result = k;
      e->weak = t.impl().storage;
      e->base = View::of(t);
      e->version = t.impl().version;
      e->version_at_record = t.version();
      e->bytes = std::int64_t(s->nbytes());
      e->category = s->category();
      e->last_access = ++clock;
      e->next_use = rec->seq;
      by_storage[s] = e;
      rec->results[k] = e;
    }
    for (const DerivedResult& d : call.derived) derive(call, *rec, d);
  }

  // How a record reads `t`: its entry (and view) if a recorded call made it,
  // else the tensor itself.
  Record::Input input_of(const Tensor& t, const std::shared_ptr<Record>& consumer) {
    Record::Input in;
    if (!t.defined()) return in;
    in.entry = entry_of(t);
    if (in.entry) {
      in.view = View::of(t);
      in.version = t.version();
      in.entry->consumers.push_back(consumer);
    } else {
      in.pinned = t.detach();
    }
    return in;
  }

  // A result the call's other results give more cheaply (DerivedResult):
  // its producer becomes a record of that derivation. The call's own record
  // still lists it, so rebuilding the call restores it too.
  void derive(const ProducedCall& call, const Record& rec, const DerivedResult& d) {
    if (d.result >= rec.results.size() || !d.fn) return;
    auto e = rec.results[d.result].lock();
    if (!e) return;
    auto dr = std::make_shared<Record>();
    dr->op = d.op;
    dr->fn = d.fn;
    dr->ns = std::max<std::int64_t>(1, std::int64_t(double(rec.ns) * d.cost_fraction));
    dr->seq = rec.seq;
    dr->category = rec.category;
    for (std::size_t k : d.from_results) dr->inputs.push_back(input_of((*call.results).at(k), dr));
    for (std::size_t k : d.from_inputs) dr->inputs.push_back(input_of((*call.inputs).at(k), dr));
    dr->results = {e};
    e->producer = std::move(dr);
    e->result = 0;
  }

  // ---- saves

  void hold(Entry& e, const char* op, std::int64_t region) {
    if (e.saves++ > 0) return;
    held_uses.insert(e.next_use);
    e.holder = op;
    e.region = region;
    e.strong = e.weak.lock();
    on_resident(e);
  }

  void drop(Entry& e) {
    if (--e.saves > 0) return;
    held_uses.erase(held_uses.find(e.next_use));
    on_gone(e);
    e.strong.reset();
    release_caches_of(*e.producer);
  }

  void set_next_use(Entry& e, std::uint64_t seq) {
    if (seq <= e.next_use) return;
    if (e.saves > 0) {
      held_uses.erase(held_uses.find(e.next_use));
      held_uses.insert(seq);
    }
    e.next_use = seq;
  }

  // How many calls away e's next use is, estimated from the backward order:
  // backward reads saves in the reverse of the order calls read them in, so
  // the latest reader among the held saves marks where it is now, and a
  // tensor whose readers are far older is needed far later. Unlike the
  // paper's staleness (time since the last access), a tensor rebuilt for an
  // early rebuild does not look recent.
  double distance(const Entry& e) const {
    if (!opts.next_use) return double(clock - e.last_access + 1);
    const std::uint64_t now = held_uses.empty() ? std::uint64_t(stats.recorded_calls) : *held_uses.rbegin();
    return double(now > e.next_use ? now - e.next_use : 0) + 1;
  }

  // ---- rebuilt intermediates
  //
  // A rebuild's result that no save holds (a projection that a rotary
  // embedding or a split read, say) would be freed at once and computed again
  // for each consumer rebuilt after it. It is kept instead, evictable like a
  // save, while a consumer call still has a result a rebuild may need: one
  // with live saves, or itself kept.

  static bool still_needed(const Entry& e) {
    for (const auto& w : e.consumers)
      if (auto r = w.lock())
        for (const auto& o : r->results)
          if (auto oe = o.lock(); oe && (oe->saves > 0 || oe->cached)) return true;
    return false;
  }

  void keep_cached(Entry& e, const std::shared_ptr<Storage>& st) {
    if (e.saves > 0 || e.cached || !still_needed(e)) return;
    e.cached = true;
    e.strong = st;
    candidates[e.id] = &e;
    stats.cached_bytes += e.bytes;
  }

  void uncache(Entry& e) {
    if (!e.cached) return;
    e.cached = false;
    candidates.erase(e.id);
    stats.cached_bytes -= e.bytes;
    e.strong.reset();
  }

  // The inputs of `r` kept for rebuilds that no longer need them go.
  void release_caches_of(const Record& r) {
    for (const Record::Input& i : r.inputs)
      if (i.entry && i.entry->cached && !still_needed(*i.entry)) {
        uncache(*i.entry);
        release_caches_of(*i.entry->producer);
      }
  }

  // e became resident with saves: the registry and the candidates know it.
  void on_resident(Entry& e) {
    if (!e.strong) return;
    saved_bytes_hold(tensor_over(e.strong, e.base, e.version), e.holder, e.region);
    candidates[e.id] = &e;
  }
  void on_gone(Entry& e) {
    if (!e.strong) return;
    saved_bytes_release(tensor_over(e.strong, e.base, e.version), e.holder, e.region);
    candidates.erase(e.id);
  }

  // ---- rebuilds

  // e's storage as its producer's result, computed again if evicted.
  Tensor materialize(Entry& e) {
    e.last_access = ++clock;
    if (auto st = e.weak.lock()) return tensor_over(st, e.base, e.version);
    std::vector<Tensor> in = rebuild_inputs(*e.producer);
    // Rebuilding a derived result's sources may have restored it (its source
    // call computes it too).
    if (auto st = e.weak.lock()) return tensor_over(st, e.base, e.version);
    const std::vector<Tensor> out = rebuild(*e.producer, std::move(in));
    return tensor_over(out[e.result].impl().storage, e.base, e.version);
  }

  std::vector<Tensor> rebuild_inputs(const Record& r) {
    REMAT_CHECK(r.fn != nullptr, AutogradError, "dynamic remat: op '", r.op, "' cannot be computed again");
    std::vector<Tensor> in;
    in.reserve(r.inputs.size());
    for (const Record::Input& i : r.inputs) {
      if (!i.entry) {
        in.push_back(i.pinned);
        continue;
      }
      Entry& e = *i.entry;
      const bool was_resident = e.resident();
      Tensor base = materialize(e);
      REMAT_CHECK(!was_resident || e.version->value.load() == i.version, AutogradError, "dynamic remat: op '", r.op,
                  "' cannot be computed again: its input (shape ", shape_str(i.view.sizes), ", made by op '",
                  e.producer->op, "') was modified in place after the call read it");
      in.push_back(tensor_over(base.impl().storage, i.view, e.version));
    }
    return in;
  }

  // Computes r's results again from `in` (rebuild_inputs(r)); the evicted
  // entries among them are resident again.
  std::vector<Tensor> rebuild(Record& r, std::vector<Tensor> in) {
    allocator_for(device()).mark(kRebuildMarker + std::string(r.op));
    const std::int64_t t0 = now_ns();
    std::vector<Tensor> out;
    {
      NoGradGuard ng;
      const ProducerObserverScope hide(nullptr);
      const RecomputeScope replaying;
      const CategoryScope cat(r.category);
      const TagScope tag(r.op);
      const RngDrawReplay draws(r.draws, r.op);
      out = r.fn(in);
      draws.done();
    }
    stats.rebuild_ms += double(now_ns() - t0) * 1e-6;
    ++stats.rebuilds;
    REMAT_CHECK(out.size() == r.results.size(), AutogradError, "dynamic remat: op '", r.op, "' gave ", out.size(),
                " results when computed again, ", r.results.size(), " the first time");
    for (std::size_t k = 0; k < out.size(); ++k) {
      auto e = r.results[k].lock();
      if (!e || e->resident()) continue;
      const Tensor& t = out[k];
      REMAT_CHECK(t.defined() && View::of(t) == e->base, AutogradError, "dynamic remat: op '", r.op, "' result ", k,
                  " came back with another layout when computed again");
      e->weak = t.impl().storage;
      by_storage[t.impl().storage.get()] = e;
      if (e->saves > 0) {
        e->strong = t.impl().storage;
        on_resident(*e);
      } else {
        keep_cached(*e, t.impl().storage);
      }
      e->last_access = ++clock;
    }
    return out;
  }

  // ---- eviction

  bool evictable(const Entry& e) const {
    return e.strong && e.strong.use_count() == 1 && e.producer && e.producer->fn &&
           e.version->value.load() == e.version_at_record;
  }

  std::int64_t find(std::int64_t c) {
    while (classes[std::size_t(c)].parent != c) {
      classes[std::size_t(c)].parent = classes[std::size_t(classes[std::size_t(c)].parent)].parent;
      c = classes[std::size_t(c)].parent;
    }
    return c;
  }

  // The evicted class of a non-resident entry (made on first sight). A
  // tensor that died without an eviction (an intermediate nothing saved)
  // joins the classes of its non-resident inputs: computing it again means
  // computing them (a rotary embedding's input is a copy of a projection
  // that nothing keeps, so evicting its output costs the projection too).
  std::int64_t class_of(Entry& e) {
    if (e.cls_generation == generation && e.cls >= 0) return find(e.cls);
    e.cls = std::int64_t(classes.size());
    e.cls_generation = generation;
    classes.push_back({e.cls, e.producer ? e.producer->ns : 0});
    if (e.producer)
      for (const Record::Input& i : e.producer->inputs)
        if (i.entry && !i.entry->resident() && i.entry->producer) unite(e.cls, class_of(*i.entry));
    return find(e.cls);
  }

  void unite(std::int64_t a, std::int64_t b) {
    a = find(a);
    b = find(b);
    if (a == b) return;
    classes[std::size_t(b)].parent = a;
    classes[std::size_t(a)].cost += classes[std::size_t(b)].cost;
  }

  // Whether a non-resident entry will be computed again if nothing changes:
  // an evicted save, or a dead intermediate such a save is made from (within
  // a few calls). A dead result that only resident tensors were made from is
  // never needed again, and evicting its input costs it nothing.
  static bool needed_again(const Entry& n, int depth = 4) {
    if (n.resident()) return false;
    if (n.saves > 0) return true;
    if (depth == 0) return false;
    for (const auto& w : n.consumers)
      if (auto r = w.lock())
        for (const auto& o : r->results)
          if (auto oe = o.lock(); oe && needed_again(*oe, depth - 1)) return true;
    return false;
  }

  // e's neighbours in DTR's sense: its call's inputs (computing e again
  // needs them) and its consumers' results that will be computed again
  // (they would need e).
  template <class Fn>
  void for_each_neighbour(Entry& e, Fn&& fn) {
    for (const Record::Input& i : e.producer->inputs)
      if (i.entry) fn(*i.entry);
    for (const auto& w : e.consumers)
      if (auto r = w.lock())
        for (const auto& o : r->results)
          if (auto oe = o.lock(); oe && needed_again(*oe)) fn(*oe);
  }

  // DTR's h with the equivalence-class neighbour cost.
  double score(Entry& e) {
    std::int64_t cost = e.producer->ns;
    std::vector<std::int64_t> seen;
    for_each_neighbour(e, [&](Entry& n) {
      if (&n == &e || n.resident() || !n.producer) return;
      const std::int64_t c = class_of(n);
      if (std::find(seen.begin(), seen.end(), c) != seen.end()) return;
      seen.push_back(c);
      cost += classes[std::size_t(c)].cost;
    });
    return double(cost) / (double(e.bytes) * distance(e));
  }

  void evict(Entry& e) {
    if (e.cached) {
      uncache(e);
      release_caches_of(*e.producer);
    } else {
      on_gone(e);
      e.strong.reset();  // the storage is freed: nothing else held it
    }
    ++stats.evictions;
    stats.evicted_bytes += e.bytes;
    allocator_for(device()).mark(kEvictMarker + std::string(e.producer->op));
    const std::int64_t c = class_of(e);
    for_each_neighbour(e, [&](Entry& n) {
      if (&n != &e && !n.resident() && n.producer) unite(c, class_of(n));
    });
  }

  // Picks the entry to evict for a request charged `charge` bytes; null if none.
  Entry* choose(CachingAllocator& allocator, std::int64_t charge) {
    std::vector<Entry*> pool;
    for (auto& [id, e] : candidates)
      if (evictable(*e)) pool.push_back(e);
    if (pool.empty()) return nullptr;
    if (opts.sample && pool.size() > 16) {
      const auto n = std::size_t(std::ceil(std::sqrt(double(pool.size()))));
      const std::size_t stride = pool.size() / n, start = std::size_t(clock % stride);
      std::vector<Entry*> picked;
      for (std::size_t i = start; i < pool.size() && picked.size() < n; i += stride) picked.push_back(pool[i]);
      pool = std::move(picked);
    }
    std::vector<std::pair<double, Entry*>> scored;
    for (Entry* e : pool) scored.emplace_back(score(*e), e);
    auto best = std::min_element(scored.begin(), scored.end(),
                                 [](const auto& a, const auto& b) { return a.first < b.first; });
    if (!opts.fragmentation_aware) return best->second;
    Entry* pick = nullptr;
    double pick_score = 0;
    for (const auto& [s, e] : scored)
      if (s <= best->first * opts.near_equal && (!pick || s < pick_score) &&
          allocator.free_run_if_freed(e->strong->data()) >= charge) {
        pick = e;
        pick_score = s;
      }
    if (pick && pick != best->second) ++stats.fragmentation_picks;
    return pick ? pick : best->second;
  }

  Device device() const override { return opts.device.value_or(kCPU); }
  std::int64_t budget() const override { return opts.budget; }

  bool relieve(CachingAllocator& allocator, std::int64_t allocated, std::int64_t charge) override {
    purge();  // records of dead storages let go of the tensors they kept
    allocated = allocator.stats().allocated_bytes;
    std::int64_t need = allocated + charge - opts.budget;
    if (need <= 0) return true;
    bool freed = false;
    while (need > 0) {
      Entry* e = choose(allocator, charge);
      if (!e) break;
      const std::int64_t before = allocator.stats().allocated_bytes;
      evict(*e);
      need -= before - allocator.stats().allocated_bytes;
      freed = true;
    }
    if (!freed) throw OutOfMemoryError(describe_oom(allocator, allocated, charge));
    return true;
  }

  std::string describe_oom(CachingAllocator& allocator, std::int64_t allocated, std::int64_t charge) const {
    std::ostringstream o;
    const MemoryStats s = allocator.stats();
    o << "dynamic remat: an allocation of " << format_bytes(charge) << (*current_tag() ? " by op '" : "")
      << current_tag() << (*current_tag() ? "'" : "") << " would take allocated bytes on " << device() << " to "
      << format_bytes(allocated + charge) << ", above the budget of " << format_bytes(opts.budget)
      << ", and nothing is left to evict. Allocated by category:";
    for (std::size_t c = 0; c < kNumMemoryCategories; ++c)
      if (s.category_bytes[c] > 0) o << " " << category_name(MemoryCategory(c)) << " " << format_bytes(s.category_bytes[c]);
    std::vector<const Entry*> held;
    for (const auto& [id, e] : candidates) held.push_back(e);
    std::sort(held.begin(), held.end(), [](const Entry* a, const Entry* b) { return a->bytes > b->bytes; });
    o << ". Saved tensors resident (and rebuilt ones kept): " << held.size();
    for (std::size_t i = 0; i < held.size() && i < 4; ++i) {
      const Entry& e = *held[i];
      o << (i ? "; " : " (largest: ") << format_bytes(e.bytes)
        << (e.cached ? " kept for rebuilds, made by '" : " saved by '") << (e.cached ? e.producer->op : e.holder) << "', "
        << (e.strong.use_count() > 1 ? "in use" : !e.producer->fn ? "not recomputable" : "modified in place");
    }
    if (!held.empty()) o << ")";
    o << ". Raise --memory-budget, or add a checkpoint plan (per_block+dynamic)";
    return o.str();
  }

  std::int64_t evict_all() {
    std::int64_t n = 0;
    std::vector<Entry*> all;
    for (auto& [id, e] : candidates) all.push_back(e);
    for (Entry* e : all)
      if (evictable(*e)) {
        evict(*e);
        ++n;
      }
    return n;
  }
};

namespace {

// What a save is packed into.
struct Handle {
  std::shared_ptr<DynamicRemat::Core> core;
  std::shared_ptr<Entry> entry;
  View view;
  Handle(std::shared_ptr<DynamicRemat::Core> c, std::shared_ptr<Entry> e, View v, const SaveInfo& info)
      : core(std::move(c)), entry(std::move(e)), view(std::move(v)) {
    core->hold(*entry, info.op, info.region);
  }
  ~Handle() { core->drop(*entry); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
};

class DynamicSaveHooks final : public TypedSavedTensorHooks {
 public:
  explicit DynamicSaveHooks(std::shared_ptr<DynamicRemat::Core> core) : core_(std::move(core)) {}
  std::string name() const override { return "dynamic remat"; }
  bool wants(const Tensor& t, const SaveInfo&) const override {
    auto e = core_->entry_of(t);
    return e && e->producer->fn;
  }
  std::any pack_tensor(const Tensor& t, const SaveInfo& info) override {
    return std::make_shared<Handle>(core_, core_->entry_of(t), View::of(t), info);
  }
  Tensor unpack_tensor(std::any packed, const SaveInfo&) override {
    const auto& h = std::any_cast<const std::shared_ptr<Handle>&>(packed);
    Tensor base = core_->materialize(*h->entry);
    return tensor_over(base.impl().storage, h->view, h->entry->version);
  }
  std::size_t held_bytes(const std::any&) const override { return 0; }  // the registry hears from the core

 private:
  std::shared_ptr<DynamicRemat::Core> core_;
};

}  // namespace

DynamicRemat::DynamicRemat(DynamicRematOptions options) : core_(std::make_shared<Core>(options)) {
  REMAT_CHECK(options.budget >= 0, Error, "dynamic remat: the budget must be >= 0 bytes, got ", options.budget);
  REMAT_CHECK(options.near_equal >= 1, Error, "dynamic remat: near_equal must be >= 1, got ", options.near_equal);
}

DynamicRemat::~DynamicRemat() {
  // Entries the map keeps hold the core; saves still alive keep theirs.
  core_->by_storage.clear();
}

const DynamicRematOptions& DynamicRemat::options() const { return core_->opts; }

void DynamicRemat::set_budget(std::int64_t budget) {
  REMAT_CHECK(budget >= 0, Error, "dynamic remat: the budget must be >= 0 bytes, got ", budget);
  core_->opts.budget = budget;
}

DynamicRematStats DynamicRemat::stats() const {
  DynamicRematStats s = core_->stats;
  for (const auto& [id, e] : core_->candidates) {
    if (!e->cached) s.resident_saved_bytes += e->bytes;
    if (core_->evictable(*e)) s.evictable_bytes += e->bytes;
  }
  return s;
}

std::int64_t DynamicRemat::evict_all() { return core_->evict_all(); }

DynamicRematScope::DynamicRematScope(std::shared_ptr<DynamicRemat> remat) : remat_(std::move(remat)) {
  if (!remat_) return;
  DynamicRemat::Core& core = *remat_->core_;
  ++core.generation;  // evicted classes start afresh
  core.classes.clear();
  observe_.emplace(&core);
  saves_.emplace(std::make_shared<DynamicSaveHooks>(remat_->core_));
  pressure_.emplace(core);
}

namespace {
DynamicRematOptions budget_on(std::int64_t budget, Device device) {
  DynamicRematOptions o;
  o.budget = budget;
  o.device = device;
  return o;
}
}  // namespace

DynamicRematScope::DynamicRematScope(std::int64_t budget, Device device)
    : DynamicRematScope(std::make_shared<DynamicRemat>(budget_on(budget, device))) {}

DynamicRematScope::~DynamicRematScope() {
  if (remat_) remat_->core_->purge();  // what dead storages' records kept goes now, not at the next purge
}

}  // namespace remat
