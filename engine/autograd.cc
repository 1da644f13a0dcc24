// Grad mode, nodes and their recording, a leaf's gradient sink, and Tensor's
// autograd members. Saved tensors are in saved_tensor.cc, the saved-bytes
// registry in saved_bytes.cc, the executor (backward, grad) in backward.cc,
// and the gradient arithmetic the engine runs itself in gradient_kernels.cc.
#include "engine/autograd.h"

#include <atomic>
#include <limits>
#include <memory>
#include <vector>

#include "engine/autograd_internal.h"
#include "engine/grad_mode.h"

namespace remat {

namespace {
thread_local bool tls_grad_enabled = true;
thread_local AutogradCounters tls_counters;
std::atomic<std::uint64_t> g_sequence{0};
}  // namespace

bool grad_enabled() { return tls_grad_enabled; }
void set_grad_enabled(bool enabled) { tls_grad_enabled = enabled; }
AutogradCounters autograd_counters() { return tls_counters; }
void detail::count_node_run() { tls_counters.nodes_run++; }

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

// A leaf's first gradient: a copy of g where the leaf's placement says, or a
// clone.
Tensor placed_grad(AutogradMeta& meta, const std::shared_ptr<TensorImpl>& leaf, const Tensor& g) {
  if (!meta.grad_placement) return g.clone();
  Tensor dst = meta.grad_placement(Tensor(leaf));
  if (!dst.defined()) return g.clone();
  REMAT_CHECK(dst.sizes() == g.sizes() && dst.dtype() == g.dtype() && dst.device() == g.device(), AutogradError,
              "gradient placement: the leaf's gradient is ", g.dtype(), " ", shape_str(g.sizes()), " on ", g.device(),
              " but its placement gave ", dst.dtype(), " ", shape_str(dst.sizes()), " on ", dst.device());
  NoGradGuard ng;
  dst.copy_(g);
  return dst;
}

// The sink for a leaf's gradient: runs the leaf's hooks, then accumulates.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf)
      : Node("AccumulateGrad"), leaf_(std::move(leaf)) {
    // Runs as soon as it is ready, so a parameter's incoming gradient is
    // added and freed at once. A leaf's sink outlives the graphs that use it
    // (its creation order is the first use's), so by creation order it would
    // wait behind every newer node: a pipeline stage's second micro-batch
    // held all its weight gradients to the end of its backward.
    sequence_nr_ = std::numeric_limits<std::uint64_t>::max();
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
      meta.grad = placed_grad(meta, leaf_, g);
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

bool detail::is_accumulate_grad(const Node* node) {
  return dynamic_cast<const AccumulateGrad*>(node) != nullptr;
}

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

void Tensor::set_grad_placement(std::function<Tensor(const Tensor&)> place) const {
  REMAT_CHECK(requires_grad() && !impl().autograd->grad_fn, AutogradError, "set_grad_placement: tensor of shape ",
              shape_str(sizes()), " is not a leaf that requires grad");
  impl().autograd->grad_placement = std::move(place);
}

void Tensor::register_post_accumulate_hook(std::function<void(const Tensor&)> hook) const {
  REMAT_CHECK(requires_grad() && !impl().autograd->grad_fn, AutogradError,
              "register_post_accumulate_hook: tensor of shape ", shape_str(sizes()),
              " is not a leaf that requires grad");
  impl().autograd->post_accumulate_hooks.push_back(std::move(hook));
}

}  // namespace remat
