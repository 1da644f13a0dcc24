// The one dispatch point every op runs through. It knows the op's name,
// inputs and outputs, tags the op's allocations with its name, and lets a
// thread-local stack of hooks observe or intercept ops, so higher layers
// (selective checkpoint policies, profilers, FLOP counters) work without ops/
// ever including them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "engine/tensor.h"

namespace remat {

// One op call as hooks see it.
struct OpCall {
  const char* name;
  const std::vector<Tensor>& inputs;
};

class DispatchHook {
 public:
  virtual ~DispatchHook() = default;
  // Before the op runs. Returning outputs skips the op entirely (its kernel
  // and its autograd recording); the outermost hook that returns wins.
  virtual std::optional<std::vector<Tensor>> before(const OpCall&) { return std::nullopt; }
  // Outputs the op should use instead of running its kernel, while still
  // recording autograd and its saves as usual (selective checkpoint replays
  // hand back cached results this way). Ops that support it take them with
  // take_kernel_outputs(); others compute as usual.
  virtual std::optional<std::vector<Tensor>> kernel_outputs(const OpCall&) { return std::nullopt; }
  // The op took the outputs this hook's kernel_outputs offered for `call`
  // (its kernel did not run). Called from inside the op's body, at the take.
  virtual void kernel_outputs_taken(const OpCall&) {}
  // After the op ran (or was intercepted), with its outputs.
  virtual void after(const OpCall&, const std::vector<Tensor>& /*outputs*/) {}
};

// Inside an op's dispatched body: the replacement outputs a hook offered for
// this call (once; later calls return nothing). Tells the offering hook
// (kernel_outputs_taken).
std::optional<std::vector<Tensor>> take_kernel_outputs();

// RAII: pushes a hook on this thread's dispatch stack.
class DispatchHookScope {
 public:
  explicit DispatchHookScope(std::shared_ptr<DispatchHook> hook);
  ~DispatchHookScope();
  DispatchHookScope(const DispatchHookScope&) = delete;
  DispatchHookScope& operator=(const DispatchHookScope&) = delete;
};

// Runs op `name` over `inputs`: `fn` computes and records the outputs.
std::vector<Tensor> dispatch(const char* name, const std::vector<Tensor>& inputs,
                             const std::function<std::vector<Tensor>()>& fn);
// The same for an op with one output.
Tensor dispatch1(const char* name, const std::vector<Tensor>& inputs,
                 const std::function<Tensor()>& fn);

// Ops dispatched on this thread since it started (nested ops count too).
std::int64_t ops_dispatched();

}  // namespace remat
