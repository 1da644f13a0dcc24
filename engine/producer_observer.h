// Which call produced each tensor, and how to compute it again: the seam
// dynamic rematerialization (checkpoint/dynamic_remat.h) builds on. While an
// observer is installed on a thread, the op runner (ops/op.h) and the
// engine's own copies (clone, casts) report every call they run with grad
// mode on in the forward (and in checkpoint replays during backward): its inputs, its results, the random draws it made, its time, and
// a function that computes the results again. Calls a reported call runs
// inside its forward are not reported (its report covers them).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "engine/rng.h"
#include "engine/tensor.h"

namespace remat {

// Computes a call's results (its outputs, then its intermediates) again from
// inputs equal to the call's, bit for bit, when run inside an RngDrawReplay
// of the call's draws and with grad mode off.
using RecomputeFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

// A result of a call that its other results (and inputs) give again more
// cheaply than the whole forward, bit for bit: a fused residual add and norm's
// normalised output is rms_norm of its sum. Dynamic rematerialization
// rebuilds the result from these sources instead of running the call again.
struct DerivedResult {
  std::size_t result = 0;                 // index into the call's results
  std::vector<std::size_t> from_results;  // sources: these results, then
  std::vector<std::size_t> from_inputs;   // these inputs, in this order
  RecomputeFn fn;                         // sources -> {the result}, with grad mode off
  const char* op = "";                    // what fn runs (names the rebuild)
  double cost_fraction = 1;               // its time, as a fraction of the call's
};

// One reported call.
struct ProducedCall {
  const char* op = "";
  const std::vector<Tensor>* inputs = nullptr;   // in call order (undefined where absent)
  const std::vector<Tensor>* results = nullptr;  // outputs, then intermediates
  std::vector<RngState> draws;                   // the random draws its forward made, in order
  std::int64_t ns = 0;                           // the forward's wall time
  // Storages with a smaller serial existed before the call: a result over one
  // (a tensor its attributes held, handed back) is not its product.
  std::uint64_t first_serial = 0;
  // It ran a collective (the op record says so): its results depend on other
  // ranks and cannot be computed again here; `recompute` is null.
  bool collective = false;
  std::vector<DerivedResult> derived;  // cheaper ways to some results (none for a collective)
};

class ProducerObserver {
 public:
  virtual ~ProducerObserver() = default;
  virtual void produced(const ProducedCall& call, RecomputeFn recompute) = 0;
};

// This thread's observer (null: none, or inside a reported call's forward).
ProducerObserver* producer_observer();

// RAII: installs `observer` (null hides the current one) for the scope.
class ProducerObserverScope {
 public:
  explicit ProducerObserverScope(ProducerObserver* observer);
  ~ProducerObserverScope();
  ProducerObserverScope(const ProducerObserverScope&) = delete;
  ProducerObserverScope& operator=(const ProducerObserverScope&) = delete;

 private:
  ProducerObserver* previous_;
};

// RAII around one call's forward (used by the op runner and the engine's
// copies). When an observer is installed and grad mode is on, it hides the
// observer from the calls the forward runs, logs the forward's draws and
// times it; report() then hands the call to the observer. Inactive (no cost
// beyond a check) otherwise.
class ProducerCapture {
 public:
  ProducerCapture();
  ~ProducerCapture();
  ProducerCapture(const ProducerCapture&) = delete;
  ProducerCapture& operator=(const ProducerCapture&) = delete;

  bool active() const { return observer_ != nullptr; }
  // Reports the call (once; nothing when inactive). Call after the forward
  // returned; `recompute` and `derived` are ignored for a collective.
  void report(const char* op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& results, bool collective,
              RecomputeFn recompute, std::vector<DerivedResult> derived = {});

 private:
  ProducerObserver* observer_ = nullptr;
  std::optional<ProducerObserverScope> hide_;
  std::optional<RngDrawLog> draws_;
  std::chrono::steady_clock::time_point start_;
  std::uint64_t first_serial_ = 0;
};

}  // namespace remat
