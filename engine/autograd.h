// Tape-based autograd. Each differentiable op run with grad enabled records a
// Node: its backward function, edges to the nodes of its inputs, and the
// SavedTensors it needs. backward() walks the recorded graph in reverse
// (newest node first), accumulates into leaves' .grad, and releases each
// node's saved tensors as soon as its backward has run, unless the graph is
// retained.
//
// SavedTensor is the object everything about recomputation builds on: it
// knows the op that saved it, its bytes, the version it was saved at and its
// checkpoint region, and it is packed/unpacked through a stack of
// saved-tensor hooks (checkpointing, offload, compression) at save time.
#pragma once

#include <any>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <typeinfo>
#include <vector>

#include "engine/grad_mode.h"
#include "engine/tensor.h"

namespace remat {

class Node;

// A gradient hook: sees the gradient flowing into a tensor and may return a
// replacement (or an undefined tensor to keep it).
using GradHook = std::function<Tensor(const Tensor&)>;
// Runs after a leaf's .grad was accumulated (the leaf is passed in); data
// parallel uses it to start reducing gradients while backward goes on.
using PostAccumulateHook = std::function<void(const Tensor& leaf)>;
// Where a leaf's first gradient goes: a tensor of the leaf's shape and dtype
// on its device (a view into a caller's buffer), or undefined for a clone.
using GradPlacement = std::function<Tensor(const Tensor& leaf)>;

// Where a gradient goes: input `input_nr` of `node` (the node's output slot).
struct Edge {
  std::shared_ptr<Node> node;
  std::uint32_t input_nr = 0;
  bool valid() const { return node != nullptr; }
};

struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;                       // accumulated gradient of a leaf
  std::shared_ptr<Node> grad_fn;     // null for leaves
  std::uint32_t output_nr = 0;       // which output of grad_fn this tensor is
  std::weak_ptr<Node> accumulator;   // a leaf's AccumulateGrad node, while a graph uses it
  std::vector<GradHook> hooks;       // a leaf's gradient hooks
  std::vector<PostAccumulateHook> post_accumulate_hooks;
  GradPlacement grad_placement;      // a leaf's: where its first gradient is written (null: a fresh clone)
};

// Shape, dtype and device of a tensor: what backward needs to build a zero
// gradient for an output that received none.
struct TensorMeta {
  Shape sizes;
  DType dtype = DType::f32;
  Device device;
};

// ---------------------------------------------------------------------------
// Saved tensors and their hooks

// What the hooks and the registry know about one save.
struct SaveInfo {
  std::uint64_t id = 0;           // unique per save, increasing
  const char* op = "";            // the op that saved the tensor
  TensorMeta meta;
  std::size_t bytes = 0;          // numel * element size
  bool is_output = false;         // the op saved its own output
  std::int64_t region = -1;       // checkpoint region id, -1 outside any region
};

// A pack/unpack pair applied to every tensor an op saves while the hooks are
// active. Hooks stack: the innermost (most recently pushed) packs first and
// each outer hook packs what the inner one returned; unpack runs in reverse.
// A hook whose accepts() declines a value is skipped for that save entirely
// (no pack, unpack or on_release): the value passes through it untouched.
// Most hooks should derive from TypedSavedTensorHooks below, which sees only
// tensors.
class SavedTensorHooks {
 public:
  virtual ~SavedTensorHooks() = default;
  // Names the hook in errors (default: its C++ type name).
  virtual std::string name() const;
  // Whether this hook packs `value` (default: every value).
  virtual bool accepts(const std::any& /*value*/, const SaveInfo& /*info*/) const { return true; }
  // `value` holds a Tensor for the innermost hook, else the inner hook's
  // result. When that is a Tensor, info.meta describes it (not the original
  // save), in pack and in unpack.
  virtual std::any pack(std::any value, const SaveInfo& info) = 0;
  // Returns what pack received. If that was a Tensor, it must be a Tensor of
  // the same shape and dtype, else unpack raises AutogradError naming the hook.
  virtual std::any unpack(std::any packed, const SaveInfo& info) = 0;
  // Bytes the packed value keeps alive, for the saved-bytes registry. The
  // default counts a packed Tensor's bytes and nothing else.
  virtual std::size_t held_bytes(const std::any& packed) const;
  // The save is being dropped (its node ran backward, or its graph died)
  // without another unpack. Called on the outermost hook that packed it only:
  // what inner hooks packed lives inside that value and goes with it.
  virtual void on_release(const std::any& /*packed*/, const SaveInfo& /*info*/) {}
};

// Saved-tensor hooks that see only tensors: pack_tensor turns a Tensor into a
// Tensor or any other value, unpack_tensor turns that back into the Tensor.
// Values that inner hooks packed into something other than a Tensor (a
// checkpoint region's placeholder, say) pass by untouched, so these hooks
// compose with checkpoint(), offload and each other without special cases.
class TypedSavedTensorHooks : public SavedTensorHooks {
 public:
  // Whether to pack this tensor (default: all); declined ones pass by.
  virtual bool wants(const Tensor& /*t*/, const SaveInfo& /*info*/) const { return true; }
  virtual std::any pack_tensor(const Tensor& t, const SaveInfo& info) = 0;
  // Gets what pack_tensor returned; returns the tensor it was given (same
  // shape and dtype; it may live elsewhere or be a recomputed copy).
  virtual Tensor unpack_tensor(std::any packed, const SaveInfo& info) = 0;

  bool accepts(const std::any& value, const SaveInfo& info) const final;
  std::any pack(std::any value, const SaveInfo& info) final;
  std::any unpack(std::any packed, const SaveInfo& info) final;
};

// A readable name of a C++ type (demangled), for error messages.
std::string type_name(const std::type_info& type);

// RAII: pushes hooks onto this thread's stack for the scope's lifetime.
class SavedTensorHooksScope {
 public:
  explicit SavedTensorHooksScope(std::shared_ptr<SavedTensorHooks> hooks);
  ~SavedTensorHooksScope();
  SavedTensorHooksScope(const SavedTensorHooksScope&) = delete;
  SavedTensorHooksScope& operator=(const SavedTensorHooksScope&) = delete;
};

// RAII: hides every active saved-tensor hook (saves inside are kept plainly).
class DisableSavedTensorHooks {
 public:
  DisableSavedTensorHooks();
  ~DisableSavedTensorHooks();
  DisableSavedTensorHooks(const DisableSavedTensorHooks&) = delete;
  DisableSavedTensorHooks& operator=(const DisableSavedTensorHooks&) = delete;

 private:
  std::vector<std::shared_ptr<SavedTensorHooks>> saved_;
};

// The checkpoint region new saves on this thread belong to (-1: none). Set by
// checkpoint/ through RegionScope.
std::int64_t current_save_region();
class RegionScope {
 public:
  explicit RegionScope(std::int64_t region);
  ~RegionScope();
  RegionScope(const RegionScope&) = delete;
  RegionScope& operator=(const RegionScope&) = delete;

 private:
  std::int64_t previous_;
};

// A tensor saved for backward. It holds a history-free alias of the tensor
// (so a node saving its own output makes no reference cycle), or whatever the
// active hooks packed it into.
class SavedTensor {
 public:
  // Saves `t` for op `op`, running the active hooks. An undefined tensor is
  // saved as undefined.
  SavedTensor(const Tensor& t, const char* op, bool is_output);
  ~SavedTensor();
  SavedTensor(const SavedTensor&) = delete;
  SavedTensor& operator=(const SavedTensor&) = delete;

  // The tensor, unpacked through the hooks. Throws AutogradError if it was
  // released (backward already ran without retain_graph) or if the tensor was
  // modified in place after it was saved.
  Tensor unpack() const;
  // Drops the saved data (idempotent).
  void release();
  bool released() const { return released_; }
  bool defined() const { return defined_; }
  const SaveInfo& info() const { return info_; }
  std::uint64_t saved_version() const { return saved_version_; }
  // Bytes this save keeps alive right now (0 once released, or when a hook
  // replaced the data by a placeholder).
  std::size_t held_bytes() const { return held_bytes_; }

 private:
  // A hook that packed this save, and what it was given.
  struct Packer {
    std::shared_ptr<SavedTensorHooks> hooks;
    bool got_tensor = false;  // it packed a Tensor (so unpack must give one back)
    TensorMeta meta;          // that tensor's shape, dtype and device
  };

  SaveInfo info_;
  bool defined_ = false;
  bool released_ = false;
  std::uint64_t saved_version_ = 0;
  std::shared_ptr<VersionCounter> version_;
  std::vector<Packer> hooks_;  // the hooks that packed it, innermost first
  std::any packed_;
  std::size_t held_bytes_ = 0;
  Tensor held_;  // what the registry counts (the packed tensor, if any)
};

// Bytes held for backward right now, across threads: by saved tensors, and
// by the checkpoint engine (region boundaries, regenerated tensors, cached
// outputs). live_bytes and peak_bytes count each storage once however many
// holders it has (the memory really held); bytes_by_op and bytes_by_region
// attribute each holder its own tensor's bytes, so a tensor saved by two ops
// appears under both. The peak is since the last reset_saved_bytes_peak.
struct SavedBytesReport {
  std::int64_t live_bytes = 0;
  std::int64_t peak_bytes = 0;
  // The same, without storages of the persistent categories (parameters,
  // gradients, optimizer state) that ops save too: the activation memory
  // kept for backward.
  std::int64_t activation_live_bytes = 0;
  std::int64_t activation_peak_bytes = 0;
  std::int64_t live_count = 0;  // SavedTensors holding data
  std::map<std::string, std::int64_t> bytes_by_op;
  std::map<std::int64_t, std::int64_t> bytes_by_region;  // -1: outside regions
};
SavedBytesReport saved_bytes_report();
// Registers (hold) or unregisters (release) `t` as held for backward by
// `holder` (an op name such as "checkpoint_boundary") in `region`. Calls must
// pair up with the same arguments.
void saved_bytes_hold(const Tensor& t, const std::string& holder, std::int64_t region);
void saved_bytes_release(const Tensor& t, const std::string& holder, std::int64_t region);
std::int64_t saved_bytes_live();
void reset_saved_bytes_peak();

// ---------------------------------------------------------------------------
// Nodes

class Node : public std::enable_shared_from_this<Node> {
 public:
  // grads[i] is the gradient of output i (zeros if none flowed); returns one
  // gradient per next edge (undefined where that input needs none).
  using BackwardFn = std::function<std::vector<Tensor>(Node& self, std::vector<Tensor>& grads)>;

  explicit Node(const char* name);
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const char* name() const { return name_; }
  // Creation order; backward runs newer nodes first (a leaf's AccumulateGrad
  // is the largest: it runs as soon as it is ready).
  std::uint64_t sequence_nr() const { return sequence_nr_; }

  // Saves `t` for backward (through the active hooks); returns its index.
  std::size_t save(const Tensor& t, bool is_output = false);
  // Saved tensor `i`, unpacked. Throws AutogradError after release.
  Tensor saved(std::size_t i) const;
  const std::vector<std::unique_ptr<SavedTensor>>& saved_tensors() const { return saved_; }
  // Frees every saved tensor (called after this node's backward).
  void release_saved();
  bool released() const { return released_; }
  // True if input `i` of the op needs a gradient.
  bool needs_input_grad(std::size_t i) const {
    return i < next_edges.size() && next_edges[i].valid();
  }

  // Runs the backward function.
  virtual std::vector<Tensor> apply(std::vector<Tensor>& grads);

  std::vector<Edge> next_edges;               // one per op input
  std::vector<TensorMeta> outputs;            // one per op output
  std::vector<std::vector<GradHook>> output_hooks;  // hooks on output grads
  BackwardFn backward_fn;
  // A view's node (narrow, slice, select): the region of its input's
  // gradient that its output's gradient is. Where the input's gradient
  // buffer already exists and is the engine's alone, the engine adds the
  // gradient into that region instead of running backward_fn (a zero-filled
  // copy of the input's shape, added in whole): the same sums, without the
  // copy.
  std::function<Tensor(const Tensor& input_grad)> view_region;

 protected:
  const char* name_;
  std::uint64_t sequence_nr_;
  std::vector<std::unique_ptr<SavedTensor>> saved_;
  bool released_ = false;
};

// ---------------------------------------------------------------------------
// Recording (used by ops)

namespace autograd {

// The node for an op over `inputs` if grad mode is on and any input requires
// grad; nullptr otherwise (the op then records nothing).
std::shared_ptr<Node> make_node(const char* name, const std::vector<const Tensor*>& inputs);
std::shared_ptr<Node> make_node(const char* name, std::initializer_list<const Tensor*> inputs);
// Makes `outputs` the outputs of `node` (they now require grad). Call after
// the node's saves.
void set_history(const std::vector<Tensor*>& outputs, const std::shared_ptr<Node>& node);
void set_history(Tensor& output, const std::shared_ptr<Node>& node);

// The edge a gradient for `t` flows into (invalid if t needs no grad).
Edge gradient_edge(const Tensor& t);

}  // namespace autograd

// ---------------------------------------------------------------------------
// Running backward

// Computes gradients of `outputs` (seeded with grad_outputs; a one-element
// output may omit its seed) and accumulates them into the .grad of every leaf
// that requires grad.
void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs = {},
              bool retain_graph = false);

// Returns d(outputs)/d(inputs) without touching any .grad. An input the
// outputs do not depend on gets an undefined tensor if allow_unused, else an
// AutogradError.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false,
                         bool allow_unused = false);

// What the autograd engine on this thread is doing: nothing, a backward()
// (accumulating into leaves) or a grad() (capturing gradients).
enum class BackwardMode { none, backward, grad };
BackwardMode backward_mode();

// Counters of the autograd engine on this thread (for tests and benchmarks).
struct AutogradCounters {
  std::int64_t nodes_created = 0;
  std::int64_t nodes_run = 0;       // backward functions executed
};
AutogradCounters autograd_counters();

namespace detail {
// acc += g in place (same shape and device; acc in any strided layout, e.g.
// a view's region of a gradient buffer), summed in f32 and rounded to acc's
// dtype, on the CPU or a CUDA device (engine/gradient_kernels.cc).
void add_into(Tensor& acc, const Tensor& g);
// Whether `t` may be overwritten without anyone seeing it: this handle is the
// only one, no other tensor shares its storage, it covers that storage
// densely, the caching allocator owns the storage, and t has no history.
bool writable_alone(const Tensor& t);
// Sums `g` over broadcast dims so that its shape becomes `shape`, in f32 in
// input order (deterministic), on g's device; returns g's dtype.
Tensor sum_to_shape(const Tensor& g, const Shape& shape);
}  // namespace detail

}  // namespace remat
