// The backward executor: backward() accumulates into leaves' .grad, grad()
// captures the gradients of chosen inputs. Both walk the recorded graph
// newest node first, sum gradients from several consumers into fresh
// tensors, run hooks, and release each node's saved tensors after its
// backward unless the graph is retained.
#include <algorithm>
#include <functional>
#include <queue>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "engine/autograd.h"
#include "engine/autograd_internal.h"

namespace remat {

namespace {
thread_local BackwardMode tls_backward_mode = BackwardMode::none;
}  // namespace

BackwardMode backward_mode() { return tls_backward_mode; }

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
  } else if (detail::writable_alone(slot)) {
    // Two consumers, and the first one's gradient is the engine's alone:
    // sum into it (the same sum as into a copy, one buffer fewer).
    detail::add_into(slot, g);
  } else {
    // Sum into a fresh tensor (never into a caller's tensor).
    Tensor sum = slot.clone();
    detail::add_into(sum, g);
    slot = sum;
  }
}

// A view node's gradient added into its region of its input's buffer, where
// that buffer exists and is the engine's alone (Node::view_region); false
// when the node must run its backward instead.
bool add_into_region(GraphTask& task, Node& node, const Tensor& g) {
  if (!node.view_region || node.next_edges.size() != 1 || !node.next_edges[0].valid() || !g.defined()) return false;
  const Edge& e = node.next_edges[0];
  auto it = task.buffers.find(e.node.get());
  if (it == task.buffers.end() || e.input_nr >= it->second.size()) return false;
  Tensor& slot = it->second[e.input_nr];
  const TensorMeta& m = e.node->outputs.at(e.input_nr);
  if (!detail::writable_alone(slot) || slot.dtype() != m.dtype || slot.sizes() != m.sizes) return false;
  Tensor region = node.view_region(slot);
  if (region.sizes() != g.sizes()) return false;
  detail::add_into(region, g);
  return true;
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

    const bool is_accumulator = detail::is_accumulate_grad(node);
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
      if (!add_into_region(task, *node, grads[0])) out = node->apply(grads);
      detail::count_node_run();
      if (!is_accumulator && (!out.empty() || !node->view_region))
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

}  // namespace remat
