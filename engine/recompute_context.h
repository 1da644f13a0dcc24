// The recompute context: whether code runs in the original forward or in a
// replay, so side effects (router statistics, aux-loss accumulators,
// counters, logging) happen exactly once whatever the recompute plan.
#pragma once

#include <utility>

namespace remat {

// True while a checkpoint region's forward is being replayed on this thread.
bool in_recompute();

// Replays nested on this thread right now (0 in the original forward).
int recompute_depth();

// RAII: marks this thread as replaying (checkpoint/ sets it around a replay).
class RecomputeScope {
 public:
  RecomputeScope();
  ~RecomputeScope();
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;
};

// Runs `fn` only in the original pass; a replay skips it.
template <typename Fn>
void once(Fn&& fn) {
  if (!in_recompute()) std::forward<Fn>(fn)();
}

}  // namespace remat
