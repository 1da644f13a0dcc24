#include "engine/dispatch.h"

namespace remat {

namespace {
thread_local std::vector<std::shared_ptr<DispatchHook>> tls_dispatch_hooks;
thread_local std::int64_t tls_ops = 0;
// The replacement outputs offered to the op whose body runs now, the hook
// that offered them and the call.
struct KernelOffer {
  std::optional<std::vector<Tensor>>* outputs = nullptr;
  DispatchHook* by = nullptr;
  const OpCall* call = nullptr;
};
thread_local KernelOffer tls_kernel_offer;

// Points tls_kernel_offer at this call's replacement while its body runs.
class KernelOutputsScope {
 public:
  explicit KernelOutputsScope(KernelOffer offer) : previous_(tls_kernel_offer) { tls_kernel_offer = offer; }
  ~KernelOutputsScope() { tls_kernel_offer = previous_; }
  KernelOutputsScope(const KernelOutputsScope&) = delete;
  KernelOutputsScope& operator=(const KernelOutputsScope&) = delete;

 private:
  KernelOffer previous_;
};
}  // namespace

std::optional<std::vector<Tensor>> take_kernel_outputs() {
  KernelOffer& o = tls_kernel_offer;
  if (!o.outputs || !*o.outputs) return std::nullopt;
  std::optional<std::vector<Tensor>> r = std::move(*o.outputs);
  o.outputs->reset();
  if (o.by) o.by->kernel_outputs_taken(*o.call);
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
    KernelOutputsScope none({});
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
    DispatchHook* offered_by = nullptr;
    for (const auto& h : hooks)
      if (!replacement && (replacement = h->kernel_outputs(call))) offered_by = h.get();
    KernelOutputsScope scope({&replacement, offered_by, &call});
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
    KernelOutputsScope none({});
    return fn();
  }
  auto out = dispatch(name, inputs, [&] { return std::vector<Tensor>{fn()}; });
  REMAT_CHECK(out.size() == 1, Error, "dispatch hook returned ", out.size(),
              " outputs for one-output op '", name, "'");
  return out[0];
}

}  // namespace remat
