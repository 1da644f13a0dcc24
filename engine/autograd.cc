#include "engine/autograd.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "cuda/accumulate.h"
#include "engine/cuda_layout.h"
#include "cuda/stream.h"
#include "engine/immortal.h"
#include "engine/strided.h"

namespace remat {

// ---------------------------------------------------------------------------
// Thread-local state: grad mode, hook stack, save region, counters

namespace {
thread_local bool tls_grad_enabled = true;
thread_local std::vector<std::shared_ptr<SavedTensorHooks>> tls_hooks;
thread_local std::int64_t tls_region = -1;
thread_local AutogradCounters tls_counters;
thread_local BackwardMode tls_backward_mode = BackwardMode::none;
std::atomic<std::uint64_t> g_sequence{0};
std::atomic<std::uint64_t> g_save_id{0};
}  // namespace

bool grad_enabled() { return tls_grad_enabled; }
void set_grad_enabled(bool enabled) { tls_grad_enabled = enabled; }
AutogradCounters autograd_counters() { return tls_counters; }
BackwardMode backward_mode() { return tls_backward_mode; }

SavedTensorHooksScope::SavedTensorHooksScope(std::shared_ptr<SavedTensorHooks> hooks) {
  REMAT_CHECK(hooks != nullptr, Error, "SavedTensorHooksScope: hooks must not be null");
  tls_hooks.push_back(std::move(hooks));
}
SavedTensorHooksScope::~SavedTensorHooksScope() { tls_hooks.pop_back(); }

DisableSavedTensorHooks::DisableSavedTensorHooks() : saved_(std::move(tls_hooks)) {
  tls_hooks.clear();
}
DisableSavedTensorHooks::~DisableSavedTensorHooks() { tls_hooks = std::move(saved_); }

std::size_t SavedTensorHooks::held_bytes(const std::any& packed) const {
  if (const Tensor* t = std::any_cast<Tensor>(&packed)) return t->defined() ? t->nbytes() : 0;
  return 0;
}

std::int64_t current_save_region() { return tls_region; }
RegionScope::RegionScope(std::int64_t region) : previous_(tls_region) { tls_region = region; }
RegionScope::~RegionScope() { tls_region = previous_; }

// ---------------------------------------------------------------------------
// The saved-bytes registry

namespace {
struct SavedRegistry {
  struct Holding {
    std::int64_t refs = 0;
    std::int64_t bytes = 0;
    bool activation = true;
  };
  std::mutex mu;
  std::int64_t live = 0;
  std::int64_t peak = 0;
  std::int64_t act_live = 0;
  std::int64_t act_peak = 0;
  std::int64_t count = 0;
  std::unordered_map<const void*, Holding> storages;  // storage (or raw key) -> holders
  std::map<std::string, std::int64_t> by_op;
  std::map<std::int64_t, std::int64_t> by_region;

  // key: what is held (a storage, deduplicated); bytes: its full size;
  // own_bytes: the holder's share for the by-op/by-region attribution.
  void hold(const void* key, std::int64_t bytes, const std::string& op, std::int64_t region,
            std::int64_t own_bytes, int sign, int count_delta, bool activation = true) {
    std::lock_guard<std::mutex> lock(mu);
    Holding& h = storages[key];
    if (sign > 0) {
      if (h.refs++ == 0) {
        h.bytes = bytes;
        h.activation = activation;
        live += bytes;
        if (activation) act_live += bytes;
      }
    } else {
      if (--h.refs == 0) {
        live -= h.bytes;
        if (h.activation) act_live -= h.bytes;
        storages.erase(key);
      }
    }
    peak = std::max(peak, live);
    act_peak = std::max(act_peak, act_live);
    count += count_delta;
    auto& o = by_op[op];
    o += sign * own_bytes;
    if (o == 0) by_op.erase(op);
    auto& r = by_region[region];
    r += sign * own_bytes;
    if (r == 0) by_region.erase(region);
  }

  void tensor(const Tensor& t, const std::string& op, std::int64_t region, int sign, int count_delta) {
    if (!t.defined() || !t.impl().storage) return;
    const Storage* st = t.impl().storage.get();
    const MemoryCategory c = st->category();
    const bool activation = c != MemoryCategory::parameter && c != MemoryCategory::gradient &&
                            c != MemoryCategory::optimizer;
    hold(st, std::int64_t(st->nbytes()), op, region, std::int64_t(t.nbytes()), sign, count_delta, activation);
  }
};
SavedRegistry& saved_registry() {
  static detail::Immortal<SavedRegistry> r;
  return r.get();
}
}  // namespace

SavedBytesReport saved_bytes_report() {
  auto& r = saved_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  SavedBytesReport rep;
  rep.live_bytes = r.live;
  rep.peak_bytes = r.peak;
  rep.activation_live_bytes = r.act_live;
  rep.activation_peak_bytes = r.act_peak;
  rep.live_count = r.count;
  rep.bytes_by_op = r.by_op;
  rep.bytes_by_region = r.by_region;
  return rep;
}

void saved_bytes_hold(const Tensor& t, const std::string& holder, std::int64_t region) {
  saved_registry().tensor(t, holder, region, +1, 0);
}

void saved_bytes_release(const Tensor& t, const std::string& holder, std::int64_t region) {
  saved_registry().tensor(t, holder, region, -1, 0);
}

std::int64_t saved_bytes_live() {
  auto& r = saved_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.live;
}

void reset_saved_bytes_peak() {
  auto& r = saved_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.peak = r.live;
  r.act_peak = r.act_live;
}

// ---------------------------------------------------------------------------
// SavedTensor

SavedTensor::SavedTensor(const Tensor& t, const char* op, bool is_output) {
  info_.id = ++g_save_id;
  info_.op = op;
  info_.is_output = is_output;
  info_.region = tls_region;
  if (!t.defined()) return;
  defined_ = true;
  info_.meta = TensorMeta{t.sizes(), t.dtype(), t.device()};
  info_.bytes = t.nbytes();
  saved_version_ = t.version();
  version_ = t.impl().version;
  std::any value = t.detach();
  hooks_ = tls_hooks;  // innermost last on the stack
  std::reverse(hooks_.begin(), hooks_.end());  // innermost first
  for (const auto& h : hooks_) value = h->pack(std::move(value), info_);
  if (hooks_.empty())
    held_bytes_ = info_.bytes;
  else
    held_bytes_ = hooks_.back()->held_bytes(value);
  packed_ = std::move(value);
  // The registry counts the packed tensor's storage (deduplicated), or what
  // the hook reports it keeps.
  if (const Tensor* p = std::any_cast<Tensor>(&packed_); p && p->defined() && held_bytes_ > 0) {
    held_ = *p;
    saved_registry().tensor(held_, info_.op, info_.region, +1, 1);
  } else if (held_bytes_ > 0) {
    saved_registry().hold(this, std::int64_t(held_bytes_), info_.op, info_.region, std::int64_t(held_bytes_), +1, 1);
  }
}

SavedTensor::~SavedTensor() { release(); }

void SavedTensor::release() {
  if (released_) return;
  released_ = true;
  if (!defined_) return;
  if (held_.defined())
    saved_registry().tensor(held_, info_.op, info_.region, -1, -1);
  else if (held_bytes_ > 0)
    saved_registry().hold(this, std::int64_t(held_bytes_), info_.op, info_.region, std::int64_t(held_bytes_), -1, -1);
  held_ = Tensor();
  held_bytes_ = 0;
  // Tell the hooks, outermost first (the order unpack would run in).
  for (auto it = hooks_.rbegin(); it != hooks_.rend(); ++it) (*it)->on_release(packed_, info_);
  packed_.reset();
}

Tensor SavedTensor::unpack() const {
  REMAT_CHECK(!released_, AutogradError, "backward through op '", info_.op,
              "' a second time: its saved tensors were freed after the first backward; pass "
              "retain_graph=true to the first backward if you need to run it twice");
  if (!defined_) return Tensor();
  const std::uint64_t now = version_->value.load();
  REMAT_CHECK(now == saved_version_, AutogradError, "a tensor of shape ",
              shape_str(info_.meta.sizes), " saved by op '", info_.op,
              "' for backward was modified in place afterwards (saved at version ",
              saved_version_, ", now version ", now,
              "); clone it before the in-place op, or use an out-of-place op");
  std::any value = packed_;
  for (auto it = hooks_.rbegin(); it != hooks_.rend(); ++it)
    value = (*it)->unpack(std::move(value), info_);
  const Tensor* t = std::any_cast<Tensor>(&value);
  REMAT_CHECK(t != nullptr, AutogradError, "saved-tensor hooks for op '", info_.op,
              "' did not unpack to a tensor");
  REMAT_CHECK(t->sizes() == info_.meta.sizes && t->dtype() == info_.meta.dtype, AutogradError,
              "saved-tensor hooks for op '", info_.op, "' unpacked shape ", shape_str(t->sizes()),
              " ", t->dtype(), ", expected ", shape_str(info_.meta.sizes), " ", info_.meta.dtype);
  return *t;
}

// ---------------------------------------------------------------------------
// Nodes

Node::Node(const char* name) : name_(name), sequence_nr_(g_sequence++) {
  tls_counters.nodes_created++;
}

std::size_t Node::save(const Tensor& t, bool is_output) {
  saved_.push_back(std::make_unique<SavedTensor>(t, name_, is_output));
  return saved_.size() - 1;
}

Tensor Node::saved(std::size_t i) const {
  REMAT_CHECK(i < saved_.size(), AutogradError, "op '", name_, "' has no saved tensor ", i);
  return saved_[i]->unpack();
}

void Node::release_saved() {
  released_ = true;
  for (auto& s : saved_) s->release();
}

std::vector<Tensor> Node::apply(std::vector<Tensor>& grads) {
  REMAT_CHECK(backward_fn != nullptr, AutogradError, "op '", name_, "' has no backward");
  return backward_fn(*this, grads);
}

namespace {

// The sink for a leaf's gradient: runs the leaf's hooks, then accumulates.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf)
      : Node("AccumulateGrad"), leaf_(std::move(leaf)) {
    outputs.push_back(TensorMeta{leaf_->sizes, leaf_->dtype,
                                 leaf_->storage ? leaf_->storage->device() : kCPU});
  }

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    Tensor g = grads.at(0);
    if (!g.defined()) return {};
    AutogradMeta& meta = *leaf_->autograd;
    for (const auto& h : meta.hooks)
      if (Tensor r = h(g); r.defined()) g = r;
    CategoryScope cat(MemoryCategory::gradient);
    if (!meta.grad.defined()) {
      meta.grad = g.clone();
    } else {
      detail::add_into(meta.grad, g);
    }
    if (!meta.post_accumulate_hooks.empty()) {
      const Tensor leaf(leaf_);
      for (const auto& h : meta.post_accumulate_hooks) h(leaf);
    }
    return {};
  }

  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

AutogradMeta& meta_of(const Tensor& t) {
  auto& impl = t.impl();
  if (!impl.autograd) impl.autograd = std::make_shared<AutogradMeta>();
  return *impl.autograd;
}

}  // namespace

namespace autograd {

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.impl().autograd) return {};
  AutogradMeta& m = *t.impl().autograd;
  if (m.grad_fn) return Edge{m.grad_fn, m.output_nr};
  if (!m.requires_grad) return {};
  std::shared_ptr<Node> acc = m.accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    m.accumulator = acc;
  }
  return Edge{acc, 0};
}

std::shared_ptr<Node> make_node(const char* name, const std::vector<const Tensor*>& inputs) {
  if (!tls_grad_enabled) return nullptr;
  bool any = false;
  for (const Tensor* t : inputs) any = any || (t && t->defined() && t->requires_grad());
  if (!any) return nullptr;
  auto node = std::make_shared<Node>(name);
  node->next_edges.reserve(inputs.size());
  for (const Tensor* t : inputs) node->next_edges.push_back(t ? gradient_edge(*t) : Edge{});
  return node;
}

std::shared_ptr<Node> make_node(const char* name, std::initializer_list<const Tensor*> inputs) {
  return make_node(name, std::vector<const Tensor*>(inputs));
}

void set_history(const std::vector<Tensor*>& outputs, const std::shared_ptr<Node>& node) {
  if (!node) return;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    Tensor& t = *outputs[i];
    node->outputs.push_back(TensorMeta{t.sizes(), t.dtype(), t.device()});
    node->output_hooks.emplace_back();
    auto meta = std::make_shared<AutogradMeta>();
    meta->requires_grad = true;
    meta->grad_fn = node;
    meta->output_nr = std::uint32_t(i);
    t.impl().autograd = std::move(meta);
  }
}

void set_history(Tensor& output, const std::shared_ptr<Node>& node) {
  set_history(std::vector<Tensor*>{&output}, node);
}

}  // namespace autograd

// ---------------------------------------------------------------------------
// Tensor's autograd members

bool Tensor::requires_grad() const {
  const auto& m = impl().autograd;
  return m && (m->requires_grad || m->grad_fn);
}

Tensor& Tensor::set_requires_grad(bool enable) {
  REMAT_CHECK(!enable || is_floating(dtype()), DTypeError,
              "set_requires_grad: only floating tensors (f32, bf16, f16) can require grad; this "
              "tensor of shape ", shape_str(sizes()), " has dtype ", dtype());
  REMAT_CHECK(is_leaf(), AutogradError,
              "set_requires_grad: only leaves can change requires_grad; this tensor was produced "
              "by op '", grad_fn()->name(), "' (use detach() for a new leaf)");
  meta_of(*this).requires_grad = enable;
  return *this;
}

Tensor Tensor::grad() const {
  const auto& m = impl().autograd;
  return m ? m->grad : Tensor();
}

void Tensor::set_grad(const Tensor& g) const {
  if (g.defined())
    REMAT_CHECK(g.sizes() == sizes(), ShapeError, "set_grad: gradient shape ",
                shape_str(g.sizes()), " does not match tensor shape ", shape_str(sizes()));
  auto& impl_ref = impl();
  if (!impl_ref.autograd) impl_ref.autograd = std::make_shared<AutogradMeta>();
  impl_ref.autograd->grad = g;
}

bool Tensor::is_leaf() const {
  const auto& m = impl().autograd;
  return !m || !m->grad_fn;
}

std::shared_ptr<Node> Tensor::grad_fn() const {
  const auto& m = impl().autograd;
  return m ? m->grad_fn : nullptr;
}

Tensor Tensor::detach() const {
  auto v = std::make_shared<TensorImpl>();
  const auto& s = impl();
  v->storage = s.storage;
  v->sizes = s.sizes;
  v->strides = s.strides;
  v->offset = s.offset;
  v->dtype = s.dtype;
  v->version = s.version;
  return Tensor(std::move(v));
}

void Tensor::backward(const Tensor& seed, bool retain_graph) const {
  remat::backward({*this}, seed.defined() ? std::vector<Tensor>{seed} : std::vector<Tensor>{},
                  retain_graph);
}

void Tensor::register_hook(std::function<Tensor(const Tensor&)> hook) const {
  REMAT_CHECK(requires_grad(), AutogradError,
              "register_hook: tensor of shape ", shape_str(sizes()), " does not require grad");
  AutogradMeta& m = *impl().autograd;
  if (m.grad_fn)
    m.grad_fn->output_hooks.at(m.output_nr).push_back(std::move(hook));
  else
    m.hooks.push_back(std::move(hook));
}

void Tensor::register_post_accumulate_hook(std::function<void(const Tensor&)> hook) const {
  REMAT_CHECK(requires_grad() && !impl().autograd->grad_fn, AutogradError,
              "register_post_accumulate_hook: tensor of shape ", shape_str(sizes()),
              " is not a leaf that requires grad");
  impl().autograd->post_accumulate_hooks.push_back(std::move(hook));
}

// ---------------------------------------------------------------------------
// The backward engine

namespace {

struct NodeLess {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr() < b->sequence_nr(); }
};

struct GraphTask {
  bool accumulate = true;  // write leaves' .grad (backward) or capture (grad)
  bool retain_graph = false;
  std::unordered_map<Node*, int> dependencies;
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  std::unordered_set<Node*> needed;  // grad(): nodes on a path to a target
  // grad(): (node, slot) whose incoming gradient is captured, and where to.
  std::vector<std::pair<Edge, std::size_t>> captures;
  std::vector<Tensor> captured;
};

void add_to_buffer(GraphTask& task, const Edge& e, const Tensor& g) {
  auto& buf = task.buffers[e.node.get()];
  if (buf.size() < e.node->outputs.size()) buf.resize(std::max<std::size_t>(e.node->outputs.size(), 1));
  Tensor& slot = buf.at(e.input_nr);
  if (!slot.defined()) {
    slot = g;
  } else {
    // Two consumers: sum into a fresh tensor (never into a caller's tensor).
    Tensor sum = slot.clone();
    detail::add_into(sum, g);
    slot = sum;
  }
}

void collect(GraphTask& task, const std::vector<Edge>& roots) {
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  for (const auto& e : roots)
    if (e.valid() && seen.insert(e.node.get()).second) stack.push_back(e.node.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const auto& e : n->next_edges) {
      if (!e.valid()) continue;
      task.dependencies[e.node.get()]++;
      if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }
}

// grad(): marks nodes from which a capture target is reachable.
void mark_needed(GraphTask& task, const std::vector<Edge>& roots) {
  std::unordered_set<Node*> targets;
  for (const auto& [e, idx] : task.captures) targets.insert(e.node.get());
  std::unordered_map<Node*, int> state;  // 1 visiting, 2 done
  std::function<bool(Node*)> visit = [&](Node* n) -> bool {
    auto it = state.find(n);
    if (it != state.end()) return task.needed.count(n) > 0;
    state[n] = 1;
    bool need = targets.count(n) > 0;
    for (const auto& e : n->next_edges)
      if (e.valid() && visit(e.node.get())) need = true;
    state[n] = 2;
    if (need) task.needed.insert(n);
    return need;
  };
  for (const auto& e : roots)
    if (e.valid()) visit(e.node.get());
}

// Sets this thread's backward mode for the duration of one graph task.
class BackwardModeScope {
 public:
  explicit BackwardModeScope(BackwardMode m) : previous_(tls_backward_mode) { tls_backward_mode = m; }
  ~BackwardModeScope() { tls_backward_mode = previous_; }
  BackwardModeScope(const BackwardModeScope&) = delete;
  BackwardModeScope& operator=(const BackwardModeScope&) = delete;

 private:
  BackwardMode previous_;
};

void execute(GraphTask& task, const std::vector<Edge>& roots, const std::vector<Tensor>& seeds) {
  BackwardModeScope mode(task.accumulate ? BackwardMode::backward : BackwardMode::grad);
  collect(task, roots);
  if (!task.accumulate) mark_needed(task, roots);
  for (std::size_t i = 0; i < roots.size(); ++i)
    if (roots[i].valid()) add_to_buffer(task, roots[i], seeds[i]);

  std::priority_queue<Node*, std::vector<Node*>, NodeLess> ready;
  std::unordered_set<Node*> queued;
  for (const auto& e : roots)
    if (e.valid() && task.dependencies[e.node.get()] == 0 && queued.insert(e.node.get()).second)
      ready.push(e.node.get());

  CategoryScope cat(MemoryCategory::gradient);
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    std::vector<Tensor> grads = std::move(task.buffers[node]);
    task.buffers.erase(node);
    grads.resize(std::max<std::size_t>(node->outputs.size(), grads.size()));

    // Hooks on output gradients, then captures for grad().
    for (std::size_t i = 0; i < node->output_hooks.size() && i < grads.size(); ++i)
      if (grads[i].defined())
        for (const auto& h : node->output_hooks[i])
          if (Tensor r = h(grads[i]); r.defined()) grads[i] = r;
    for (const auto& [edge, idx] : task.captures)
      if (edge.node.get() == node) {
        Tensor g = grads.at(edge.input_nr);
        if (g.defined()) {
          if (task.captured[idx].defined()) {
            Tensor s = task.captured[idx].clone();
            detail::add_into(s, g);
            task.captured[idx] = s;
          } else {
            task.captured[idx] = g;
          }
        }
      }

    const bool is_accumulator = dynamic_cast<AccumulateGrad*>(node) != nullptr;
    const bool run = task.accumulate ? true : (!is_accumulator && task.needed.count(node) > 0);
    const bool any_grad = std::any_of(grads.begin(), grads.end(), [](const Tensor& g) { return g.defined(); });
    std::vector<Tensor> out;
    if (run && any_grad) {
      // Outputs that received no gradient get zeros of their shape.
      for (std::size_t i = 0; i < node->outputs.size(); ++i)
        if (!grads[i].defined()) {
          const auto& m = node->outputs[i];
          grads[i] = zeros(m.sizes, TensorOptions(m.dtype, m.device));
        }
      TagScope tag(node->name());
      NoGradGuard no_grad;  // backward itself records nothing
      out = node->apply(grads);
      tls_counters.nodes_run++;
      if (!is_accumulator)
        REMAT_CHECK(out.size() == node->next_edges.size(), AutogradError, "backward of op '",
                    node->name(), "' returned ", out.size(), " gradients for ",
                    node->next_edges.size(), " inputs");
    }
    grads.clear();
    if (!task.retain_graph && (run || task.accumulate)) node->release_saved();

    for (std::size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.valid()) continue;
      if (i < out.size() && out[i].defined()) {
        const auto& m = e.node->outputs.at(e.input_nr);
        REMAT_CHECK(out[i].sizes() == m.sizes, AutogradError, "backward of op '", node->name(),
                    "' returned a gradient of shape ", shape_str(out[i].sizes()), " for input ", i,
                    " of shape ", shape_str(m.sizes));
        add_to_buffer(task, e, out[i]);
      }
      if (--task.dependencies[e.node.get()] == 0 && queued.insert(e.node.get()).second)
        ready.push(e.node.get());
    }
  }
}

std::vector<Tensor> seeds_for(const std::vector<Tensor>& outputs, const std::vector<Tensor>& given,
                              const char* fn) {
  REMAT_CHECK(given.empty() || given.size() == outputs.size(), AutogradError, fn, ": got ",
              given.size(), " seed gradients for ", outputs.size(), " outputs");
  std::vector<Tensor> seeds;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& o = outputs[i];
    REMAT_CHECK(o.defined() && o.requires_grad(), AutogradError, fn, ": output ", i,
                " does not require grad (it has no recorded history)");
    if (!given.empty() && given[i].defined()) {
      REMAT_CHECK(given[i].sizes() == o.sizes(), ShapeError, fn, ": seed gradient of shape ",
                  shape_str(given[i].sizes()), " for an output of shape ", shape_str(o.sizes()));
      REMAT_CHECK(given[i].device() == o.device(), DeviceError, fn, ": seed gradient on ", given[i].device(),
                  " for an output on ", o.device(), " (create the seed on the output's device)");
      seeds.push_back(given[i]);
    } else {
      REMAT_CHECK(o.numel() == 1, AutogradError, fn, ": output ", i, " has shape ",
                  shape_str(o.sizes()), "; a seed gradient is required for outputs with more "
                  "than one element");
      seeds.push_back(ones(o.sizes(), TensorOptions(o.dtype(), o.device())));
    }
  }
  return seeds;
}

}  // namespace

void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs,
              bool retain_graph) {
  std::vector<Tensor> seeds = seeds_for(outputs, grad_outputs, "backward");
  std::vector<Edge> roots;
  for (const auto& o : outputs) roots.push_back(autograd::gradient_edge(o));
  GraphTask task;
  task.accumulate = true;
  task.retain_graph = retain_graph;
  execute(task, roots, seeds);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph,
                         bool allow_unused) {
  std::vector<Tensor> seeds = seeds_for(outputs, grad_outputs, "grad");
  std::vector<Edge> roots;
  for (const auto& o : outputs) roots.push_back(autograd::gradient_edge(o));
  GraphTask task;
  task.accumulate = false;
  task.retain_graph = retain_graph;
  task.captured.resize(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    REMAT_CHECK(inputs[i].defined() && inputs[i].requires_grad(), AutogradError, "grad: input ",
                i, " of shape ", inputs[i].defined() ? shape_str(inputs[i].sizes()) : "?",
                " does not require grad");
    task.captures.emplace_back(autograd::gradient_edge(inputs[i]), i);
  }
  execute(task, roots, seeds);
  for (std::size_t i = 0; i < inputs.size(); ++i)
    REMAT_CHECK(allow_unused || task.captured[i].defined(), AutogradError, "grad: input ", i,
                " of shape ", shape_str(inputs[i].sizes()),
                " is not used by the outputs (pass allow_unused=true to get an undefined tensor)");
  return task.captured;
}

// ---------------------------------------------------------------------------
// Gradient arithmetic the engine needs itself

void detail::add_into(Tensor& acc, const Tensor& g) {
  REMAT_CHECK(acc.sizes() == g.sizes(), ShapeError, "gradient accumulation: shapes ",
              shape_str(acc.sizes()), " and ", shape_str(g.sizes()), " differ");
  REMAT_CHECK(acc.device() == g.device(), DeviceError, "gradient accumulation: the gradient is on ",
              g.device(), " but the buffer it adds into is on ", acc.device());
  if (acc.device().is_cuda()) {
    REMAT_CHECK(is_floating(acc.dtype()) && is_floating(g.dtype()), DTypeError,
                "gradient accumulation on ", acc.device(), ": expected floating dtypes, got ", acc.dtype(),
                " and ", g.dtype());
    cuda::add_into(acc.raw_data(), acc.dtype(), detail::cuda_layout(acc), g.raw_data(), g.dtype(), detail::cuda_layout(g),
                   cuda::current_stream());
    acc.bump_version();
    return;
  }
  Tensor src = g.dtype() == acc.dtype() ? g : g.to(acc.dtype());
  const std::array<const Shape*, 2> st{&acc.strides(), &src.strides()};
  dispatch_dtype(acc.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, fp8_e4m3>) {
      throw DTypeError("gradient accumulation: unsupported dtype " + std::string(dtype_name(acc.dtype())));
    } else {
      T* a = static_cast<T*>(acc.raw_data());
      const T* b = static_cast<const T*>(src.raw_data());
      for_each_run<2>(acc.sizes(), st, [&](const auto& off, std::int64_t n, const auto& inner) {
        T* pa = a + off[0];
        const T* pb = b + off[1];
        if (inner[0] == 1 && inner[1] == 1) {
          for (std::int64_t i = 0; i < n; ++i) pa[i] = T(float(pa[i]) + float(pb[i]));
        } else {
          for (std::int64_t i = 0; i < n; ++i)
            pa[i * inner[0]] = T(float(pa[i * inner[0]]) + float(pb[i * inner[1]]));
        }
      });
    }
  });
  acc.bump_version();
}

namespace {
// sum_to_shape on CUDA: dims of g that map to an output dim (stride != 0)
// are kept, the rest are summed in input order.
Tensor sum_to_shape_cuda(const Tensor& g, const Shape& shape, const Shape& out_strides_in_g) {
  cuda::Strided kept, reduced;
  for (std::size_t d = 0; d < g.sizes().size(); ++d) {
    cuda::Strided& part = out_strides_in_g[d] != 0 ? kept : reduced;
    REMAT_CHECK(part.dim < cuda::kMaxDims, ShapeError, "sum_to_shape: too many dims for CUDA: ",
                shape_str(g.sizes()));
    part.sizes[part.dim] = g.sizes()[d];
    part.strides[part.dim] = g.strides()[d];
    ++part.dim;
  }
  Tensor out = empty(shape, TensorOptions(DType::f32, g.device()));
  Tensor work;
  if (const std::int64_t w = cuda::sum_reduced_workspace(kept, reduced); w > 0)
    work = empty({w}, TensorOptions(DType::f32, g.device()));
  cuda::sum_reduced(out.data<float>(), g.raw_data(), g.dtype(), kept, reduced,
                    work.defined() ? work.data<float>() : nullptr, cuda::current_stream());
  return g.dtype() == DType::f32 ? out : out.to(g.dtype());
}
}  // namespace

Tensor detail::sum_to_shape(const Tensor& g, const Shape& shape) {
  if (g.sizes() == shape) return g;
  REMAT_CHECK(g.dim() >= std::int64_t(shape.size()), ShapeError, "sum_to_shape: cannot reduce ",
              shape_str(g.sizes()), " to ", shape_str(shape));
  // Output element o sums the input elements that broadcast onto it. Loop over
  // the input in order (deterministic) accumulating in f32.
  const std::size_t lead = g.sizes().size() - shape.size();
  Shape out_strides_in_g(g.sizes().size(), 0);  // stride into the output for each g dim
  const Shape cs = contiguous_strides(shape);
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const std::int64_t gs = g.sizes()[lead + i];
    REMAT_CHECK(shape[i] == gs || shape[i] == 1, ShapeError, "sum_to_shape: cannot reduce ",
                shape_str(g.sizes()), " to ", shape_str(shape));
    out_strides_in_g[lead + i] = shape[i] == 1 ? 0 : cs[i];
  }
  if (g.device().is_cuda()) return sum_to_shape_cuda(g, shape, out_strides_in_g);
  Tensor gf = g.dtype() == DType::f32 ? g : g.to(DType::f32);
  Tensor acc = zeros(shape, DType::f32);
  float* o = acc.data<float>();
  const float* in = gf.data<float>();
  // Serial over the input: the result must not depend on thread count.
  std::vector<std::int64_t> idx(g.sizes().size(), 0);
  const std::int64_t n = g.numel();
  const Shape& gst = gf.strides();
  std::int64_t goff = 0, ooff = 0;
  for (std::int64_t k = 0; k < n; ++k) {
    o[ooff] += in[goff];
    for (std::int64_t d = std::int64_t(idx.size()) - 1; d >= 0; --d) {
      const auto ud = std::size_t(d);
      ++idx[ud];
      goff += gst[ud];
      ooff += out_strides_in_g[ud];
      if (idx[ud] < g.sizes()[ud]) break;
      goff -= idx[ud] * gst[ud];
      ooff -= idx[ud] * out_strides_in_g[ud];
      idx[ud] = 0;
    }
  }
  return g.dtype() == DType::f32 ? acc : acc.to(g.dtype());
}

}  // namespace remat
