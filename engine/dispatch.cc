#include "engine/dispatch.h"

namespace remat {

namespace {
thread_local std::vector<std::shared_ptr<DispatchHook>> tls_dispatch_hooks;
thread_local std::int64_t tls_ops = 0;
// The replacement outputs offered to the op whose body runs now.
thread_local std::optional<std::vector<Tensor>>* tls_kernel_outputs = nullptr;

// Points tls_kernel_outputs at this call's replacement while its body runs.
class KernelOutputsScope {
 public:
  explicit KernelOutputsScope(std::optional<std::vector<Tensor>>* r) : previous_(tls_kernel_outputs) {
    tls_kernel_outputs = r;
  }
  ~KernelOutputsScope() { tls_kernel_outputs = previous_; }
  KernelOutputsScope(const KernelOutputsScope&) = delete;
  KernelOutputsScope& operator=(const KernelOutputsScope&) = delete;

 private:
  std::optional<std::vector<Tensor>>* previous_;
};
}  // namespace

std::optional<std::vector<Tensor>> take_kernel_outputs() {
  if (!tls_kernel_outputs || !*tls_kernel_outputs) return std::nullopt;
  std::optional<std::vector<Tensor>> r = std::move(*tls_kernel_outputs);
  tls_kernel_outputs->reset();
  return r;
}

DispatchHookScope::DispatchHookScope(std::shared_ptr<DispatchHook> hook) {
  REMAT_CHECK(hook != nullptr, Error, "DispatchHookScope: hook must not be null");
  tls_dispatch_hooks.push_back(std::move(hook));
}

DispatchHookScope::~DispatchHookScope() { tls_dispatch_hooks.pop_back(); }

std::int64_t ops_dispatched() { return tls_ops; }

std::vector<Tensor> dispatch(const char* name, const std::vector<Tensor>& inputs,
                             const std::function<std::vector<Tensor>()>& fn) {
  ++tls_ops;
  TagScope tag(name);
  if (tls_dispatch_hooks.empty()) {
    KernelOutputsScope none(nullptr);
    return fn();
  }
  // Hooks may push or pop hooks while they run: iterate over a snapshot.
  const auto hooks = tls_dispatch_hooks;
  const OpCall call{name, inputs};
  std::optional<std::vector<Tensor>> out;
  for (const auto& h : hooks) {
    if (auto r = h->before(call); r && !out) out = std::move(r);
  }
  if (!out) {
    std::optional<std::vector<Tensor>> replacement;
    for (const auto& h : hooks)
      if (!replacement) replacement = h->kernel_outputs(call);
    KernelOutputsScope scope(&replacement);
    out = fn();
  }
  for (auto it = hooks.rbegin(); it != hooks.rend(); ++it) (*it)->after(call, *out);
  return std::move(*out);
}

Tensor dispatch1(const char* name, const std::vector<Tensor>& inputs,
                 const std::function<Tensor()>& fn) {
  if (tls_dispatch_hooks.empty()) {
    ++tls_ops;
    TagScope tag(name);
    KernelOutputsScope none(nullptr);
    return fn();
  }
  auto out = dispatch(name, inputs, [&] { return std::vector<Tensor>{fn()}; });
  REMAT_CHECK(out.size() == 1, Error, "dispatch hook returned ", out.size(),
              " outputs for one-output op '", name, "'");
  return out[0];
}

}  // namespace remat
