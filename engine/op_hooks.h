// The one point every op call runs through. It knows the op (its record in
// the op table, engine/op_def.h), its inputs and attributes, tags the op's
// allocations with its name, and lets a thread-local stack of op hooks
// observe or intercept calls, so higher layers (selective checkpoint
// policies, profilers, FLOP counters) work without ops/ ever including them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "engine/tensor.h"

namespace remat {

class OpDef;

// One op call as hooks see it.
struct OpCall {
  const char* name;
  const std::vector<Tensor>& inputs;  // in the op's input order (undefined where an optional input is absent)
  // The op's record (nullptr for calls that have none: custom ops, and the
  // backward steps some ops run as calls of their own).
  const OpDef* op = nullptr;
  // The op's attributes, as its record reads them (OpDef::cost); nullptr when none.
  const void* attrs = nullptr;
};

class OpHook {
 public:
  virtual ~OpHook() = default;
  // Before the op runs. Returning outputs skips the op entirely (its kernel
  // and its autograd recording); the outermost hook that returns wins.
  virtual std::optional<std::vector<Tensor>> before(const OpCall&) { return std::nullopt; }
  // Outputs the op should use instead of running its kernel, while still
  // recording autograd and its saves as usual (selective checkpoint replays
  // hand back cached results this way). Ops whose record says replay_cacheable
  // take them (take_cached_outputs()); others compute as usual.
  virtual std::optional<std::vector<Tensor>> cached_outputs(const OpCall&) { return std::nullopt; }
  // The op took the outputs this hook's cached_outputs offered for `call`
  // (its kernel did not run). Called from inside the op's body, at the take.
  virtual void cached_outputs_taken(const OpCall&) {}
  // After the op ran (or was intercepted), with its outputs.
  virtual void after(const OpCall&, const std::vector<Tensor>& /*outputs*/) {}
};

// Inside an op's body: the replacement outputs a hook offered for this call
// (once; later calls return nothing). Tells the offering hook
// (cached_outputs_taken).
std::optional<std::vector<Tensor>> take_cached_outputs();

// RAII: pushes a hook on this thread's op-hook stack.
class OpHookScope {
 public:
  explicit OpHookScope(std::shared_ptr<OpHook> hook);
  ~OpHookScope();
  OpHookScope(const OpHookScope&) = delete;
  OpHookScope& operator=(const OpHookScope&) = delete;
};

// Runs `call` through the hooks: `body` computes and records the outputs
// unless a hook's before() supplies them.
std::vector<Tensor> run_op_call(const OpCall& call, const std::function<std::vector<Tensor>()>& body);
// The same for an op with one output.
Tensor run_op_call1(const OpCall& call, const std::function<Tensor()>& body);

// Op calls run on this thread since it started (nested calls count too).
std::int64_t ops_called();

// Observes the kernels ops run through their kernel tables on this thread
// (ops/kernel_table.h), forward and backward alike: a profiler. begin()
// comes right before a kernel is called and end() right after it returns
// (its device work may still be running: a device profiler records events
// on the stream). Kernels a kernel calls nest inside it. Meta's are not
// observed.
class KernelObserver {
 public:
  virtual ~KernelObserver() = default;
  // `table`: the kernel table's name (static storage).
  virtual void begin(const char* table, Device device) = 0;
  virtual void end(const char* table, Device device) = 0;
};

// RAII: `observer` watches this thread's kernel calls for the scope (the
// scope before it, if any, resumes after). It must outlive the scope.
class KernelObserverScope {
 public:
  explicit KernelObserverScope(KernelObserver& observer);
  ~KernelObserverScope();
  KernelObserverScope(const KernelObserverScope&) = delete;
  KernelObserverScope& operator=(const KernelObserverScope&) = delete;

 private:
  KernelObserver* previous_;
};

// This thread's kernel observer, or nullptr.
KernelObserver* kernel_observer();

// RAII: this thread's observer's begin() and end() around a kernel-table
// call or the engine's own device work (copies and casts, fills, gradient
// accumulation, broadcast sums), named `what` (static storage). Nothing
// without an observer or on meta.
class ObservedWork {
 public:
  ObservedWork(const char* what, Device device);
  ~ObservedWork();
  ObservedWork(const ObservedWork&) = delete;
  ObservedWork& operator=(const ObservedWork&) = delete;

 private:
  KernelObserver* observer_;
  const char* what_;
  Device device_;
};

}  // namespace remat
