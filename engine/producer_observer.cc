#include "engine/producer_observer.h"

#include "engine/autograd.h"
#include "engine/grad_mode.h"
#include "engine/recompute_context.h"

namespace remat {

namespace {
thread_local ProducerObserver* tls_observer = nullptr;
}  // namespace

ProducerObserver* producer_observer() { return tls_observer; }

ProducerObserverScope::ProducerObserverScope(ProducerObserver* observer) : previous_(tls_observer) {
  tls_observer = observer;
}
ProducerObserverScope::~ProducerObserverScope() { tls_observer = previous_; }

ProducerCapture::ProducerCapture() {
  // The forward (a checkpoint region's replay in backward included): what
  // backward itself computes is used once, right away.
  if (!tls_observer || !grad_enabled() || (backward_mode() != BackwardMode::none && !in_recompute())) return;
  observer_ = tls_observer;
  hide_.emplace(nullptr);
  draws_.emplace();
  start_ = std::chrono::steady_clock::now();
  first_serial_ = Storage::next_serial();
}

ProducerCapture::~ProducerCapture() = default;

void ProducerCapture::report(const char* op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& results,
                             bool collective, RecomputeFn recompute, std::vector<DerivedResult> derived) {
  if (!observer_) return;
  ProducerObserver* observer = observer_;
  observer_ = nullptr;
  ProducedCall call;
  call.op = op;
  call.inputs = &inputs;
  call.results = &results;
  call.ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count();
  call.draws = draws_->take();
  call.first_serial = first_serial_;
  call.collective = collective;
  if (!collective) call.derived = std::move(derived);
  draws_.reset();
  hide_.reset();
  observer->produced(call, collective ? RecomputeFn() : std::move(recompute));
}

}  // namespace remat
