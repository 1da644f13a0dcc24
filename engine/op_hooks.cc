#include "engine/op_hooks.h"

namespace remat {

namespace {
thread_local std::vector<std::shared_ptr<OpHook>> tls_op_hooks;
thread_local std::int64_t tls_ops = 0;
// The replacement outputs offered to the op whose body runs now, the hook
// that offered them and the call.
struct CachedOffer {
  std::optional<std::vector<Tensor>>* outputs = nullptr;
  OpHook* by = nullptr;
  const OpCall* call = nullptr;
};
thread_local CachedOffer tls_offer;

// Points tls_offer at this call's replacement while its body runs.
class OfferScope {
 public:
  explicit OfferScope(CachedOffer offer) : previous_(tls_offer) { tls_offer = offer; }
  ~OfferScope() { tls_offer = previous_; }
  OfferScope(const OfferScope&) = delete;
  OfferScope& operator=(const OfferScope&) = delete;

 private:
  CachedOffer previous_;
};
}  // namespace

std::optional<std::vector<Tensor>> take_cached_outputs() {
  CachedOffer& o = tls_offer;
  if (!o.outputs || !*o.outputs) return std::nullopt;
  std::optional<std::vector<Tensor>> r = std::move(*o.outputs);
  o.outputs->reset();
  if (o.by) o.by->cached_outputs_taken(*o.call);
  return r;
}

OpHookScope::OpHookScope(std::shared_ptr<OpHook> hook) {
  REMAT_CHECK(hook != nullptr, Error, "OpHookScope: hook must not be null");
  tls_op_hooks.push_back(std::move(hook));
}

OpHookScope::~OpHookScope() { tls_op_hooks.pop_back(); }

std::int64_t ops_called() { return tls_ops; }

namespace {
thread_local KernelObserver* tls_kernel_observer = nullptr;
}  // namespace

KernelObserverScope::KernelObserverScope(KernelObserver& observer) : previous_(tls_kernel_observer) {
  tls_kernel_observer = &observer;
}
KernelObserverScope::~KernelObserverScope() { tls_kernel_observer = previous_; }
KernelObserver* kernel_observer() { return tls_kernel_observer; }

ObservedWork::ObservedWork(const char* what, Device device)
    : observer_(device.is_meta() ? nullptr : tls_kernel_observer), what_(what), device_(device) {
  if (observer_) observer_->begin(what_, device_);
}
ObservedWork::~ObservedWork() {
  if (observer_) observer_->end(what_, device_);
}

std::vector<Tensor> run_op_call(const OpCall& call, const std::function<std::vector<Tensor>()>& body) {
  ++tls_ops;
  TagScope tag(call.name);
  if (tls_op_hooks.empty()) {
    OfferScope none({});
    return body();
  }
  // Hooks may push or pop hooks while they run: iterate over a snapshot.
  const auto hooks = tls_op_hooks;
  std::optional<std::vector<Tensor>> out;
  for (const auto& h : hooks) {
    if (auto r = h->before(call); r && !out) out = std::move(r);
  }
  if (!out) {
    std::optional<std::vector<Tensor>> replacement;
    OpHook* offered_by = nullptr;
    for (const auto& h : hooks)
      if (!replacement && (replacement = h->cached_outputs(call))) offered_by = h.get();
    OfferScope scope({&replacement, offered_by, &call});
    out = body();
  }
  for (auto it = hooks.rbegin(); it != hooks.rend(); ++it) (*it)->after(call, *out);
  return std::move(*out);
}

Tensor run_op_call1(const OpCall& call, const std::function<Tensor()>& body) {
  if (tls_op_hooks.empty()) {
    ++tls_ops;
    TagScope tag(call.name);
    OfferScope none({});
    return body();
  }
  auto out = run_op_call(call, [&] { return std::vector<Tensor>{body()}; });
  REMAT_CHECK(out.size() == 1, Error, "op hook returned ", out.size(), " outputs for one-output op '", call.name,
              "'");
  return out[0];
}

}  // namespace remat
