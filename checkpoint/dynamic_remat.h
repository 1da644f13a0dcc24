// Dynamic rematerialization under a hard memory budget (`--recompute
// dynamic`, docs/RECOMPUTE.md#dynamic): Dynamic Tensor Rematerialization
// (Kirisame et al., ICLR 2021) on remat's saved tensors.
//
// While a DynamicRematScope lives on a thread:
//  - every op call the thread runs with grad mode on is recorded
//    (engine/producer_observer.h): its inputs, its results, its random
//    draws, its time and a function that computes the results again;
//  - every tensor an op saves whose storage a recorded call produced is
//    packed into a handle (a saved-tensor hook, outermost of the stack), so
//    that it is evictable;
//  - before an allocation on the device would take its allocated bytes above
//    the budget, evictable saves are freed, least valuable first, until it
//    fits. Value: DTR's h = (cost + cost of evicted neighbours) / (bytes x
//    staleness), the neighbours' cost summed over equivalence classes of
//    evicted tensors (the paper's h_DTR^eq); among candidates scoring within
//    near_equal of the best, one whose block would merge with its free
//    neighbours into a block the request fits is preferred;
//  - unpacking an evicted save computes it again (its evicted inputs first,
//    recursively) with grad mode off and the call's draws replayed, bit for
//    bit; the rebuilt tensor is evictable again, and a rebuilt result no
//    save holds is kept (evictable) while another rebuild may read it. A
//    result its call declares derivable from its other results
//    (DerivedResult: add_rms_norm's y is rms_norm of h) is rebuilt from
//    them, at the declared fraction of the call's cost.
//
// Pinned (never evicted): parameters, gradients and optimizer state (no op
// produced them), tensors made outside ops (factories, host data), the
// outputs of collectives (OpSpec::collective: all-to-all dispatch and
// combine, tensor-parallel gathers; computing them again would need the
// other ranks), tensors modified in place after they were made, and any save
// something else still references (a local of the forward, a user's
// tensor). A record keeps the tensors it needs that no op produced (an
// input of a collective's output, say) until its saves are released.
// Rebuilds run no collective, so ranks never wait on each other's
// decisions.
//
// Hook order: the scope's hook is outermost. Checkpoint regions, offload and
// compression pack first; what they leave as a plain tensor is dynamic's.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/device.h"
#include "engine/producer_observer.h"

namespace remat {

// The allocator history's markers for an eviction and a rebuild (label:
// the marker and the op that made the tensor), which `mem` draws.
inline constexpr const char* kEvictMarker = "evict:";
inline constexpr const char* kRebuildMarker = "rebuild:";

struct DynamicRematOptions {
  // The most bytes allocated on `device` may reach (0: record and pack
  // only, never evict).
  std::int64_t budget = 0;
  // The device whose allocations it watches (unset: the device of the first
  // call it records).
  std::optional<Device> device;
  // Score a deterministic sample of about sqrt(n) of the n candidates (the
  // paper's sampling) instead of all of them.
  bool sample = false;
  // Prefer, among candidates scoring within near_equal of the best, one
  // whose freed block merges into a free block the request fits.
  bool fragmentation_aware = true;
  double near_equal = 1.25;
  // Divide by the distance to a tensor's next use, estimated from the
  // backward order, instead of the paper's staleness (false: staleness).
  bool next_use = true;
};

// Counters since the runtime was made.
struct DynamicRematStats {
  std::int64_t evictions = 0;
  std::int64_t evicted_bytes = 0;
  std::int64_t rebuilds = 0;          // recorded calls computed again
  double rebuild_ms = 0;              // their wall time
  std::int64_t recorded_calls = 0;
  std::int64_t fragmentation_picks = 0;  // evictions chosen for the free block they leave over a better score
  std::int64_t evictable_bytes = 0;   // now: resident saves that could be evicted
  std::int64_t resident_saved_bytes = 0;  // now: resident saves of recorded storages
  std::int64_t cached_bytes = 0;      // now: rebuilt results no save holds, kept (evictable) for rebuilds to come
};

// The runtime: records, handles, the eviction policy and its counters. One
// per budget; DynamicRematScope activates it on a thread.
class DynamicRemat {
 public:
  explicit DynamicRemat(DynamicRematOptions options);
  ~DynamicRemat();
  DynamicRemat(const DynamicRemat&) = delete;
  DynamicRemat& operator=(const DynamicRemat&) = delete;

  const DynamicRematOptions& options() const;
  // Changes the budget (bytes; 0: none) for the next allocations.
  void set_budget(std::int64_t budget);
  DynamicRematStats stats() const;
  // Evicts every evictable save now (tests: forces rebuilds); returns how many.
  std::int64_t evict_all();

  struct Core;  // checkpoint/dynamic_remat.cc

 private:
  friend class DynamicRematScope;
  std::shared_ptr<Core> core_;
};

// RAII: `remat` is active on this thread for the scope (null: the scope does
// nothing). Saves packed inside stay evictable and rebuildable after it
// ends; evictions happen only inside it.
class DynamicRematScope {
 public:
  explicit DynamicRematScope(std::shared_ptr<DynamicRemat> remat);
  // A runtime of its own for `budget` bytes on `device` (embedding programs).
  explicit DynamicRematScope(std::int64_t budget, Device device = kCPU);
  ~DynamicRematScope();
  DynamicRematScope(const DynamicRematScope&) = delete;
  DynamicRematScope& operator=(const DynamicRematScope&) = delete;

  // The active runtime (null for a scope made with null).
  DynamicRemat* remat() const { return remat_.get(); }

 private:
  std::shared_ptr<DynamicRemat> remat_;
  std::optional<ProducerObserverScope> observe_;
  std::optional<SavedTensorHooksScope> saves_;
  std::optional<MemoryPressureScope> pressure_;
};

}  // namespace remat
