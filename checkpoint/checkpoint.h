// Checkpoint regions: run a function so that the tensors its ops save for
// backward are not kept; when backward first needs one, the function is
// replayed from the region's boundary inputs (with the RNG state of the
// original run) to regenerate them. docs/RECOMPUTE.md#checkpoint-regions is the
// contract.
//
// Non-reentrant (default): built on saved-tensor hooks. Inside the region
// each save becomes a placeholder; the graph itself is recorded normally, so
// gradients reach parameters used inside the region even when no input
// requires grad, and grad() with explicit inputs works. The replay stops as
// soon as every placeholder still needed has been regenerated (early stop),
// and each regenerated tensor is dropped once its consumer has used it.
//
// Reentrant: the region records one node (kept whenever an output depends
// on something requiring grad, an input or a parameter inside); its backward
// replays the whole function with grad enabled and differentiates it on its
// own, accumulating into the .grad of the parameters inside (so they get
// gradients when no input requires grad too). It keeps nothing but its
// boundary inputs (saves of op "checkpoint_boundary", like a non-reentrant
// region's), has no early stop and no policy, and runs under backward() only:
// grad() raises AutogradError when it runs the node (a target behind one of
// its inputs), and does not see the parameters inside (grad() with one of
// them as a target reports it unused). Only its outputs carry gradients out:
// backward reaching a tensor made inside that left some other way (an
// auxiliary loss) is an AutogradError naming the region.
//
// Early stop is an exception: the replay's save hook throws an internal
// StopReplay once the last needed tensor is regenerated, and it unwinds
// through whatever the region's function is running (op bodies, saved-tensor
// hooks, op hooks, nested regions, user code). The contract every op body
// and hook keeps, so that this (or any other exception) is harmless: an
// exception thrown through it leaves the tape (no half-built node or
// history), the saved tensors (no pack without its record), the allocator
// (no block leaked or counted twice) and the hook, policy, RNG and grad-mode
// scopes as they were before the call. Only RAII achieves that: state is
// changed by scope objects whose destructors undo it, or committed after
// the last thing that can throw; nothing is left half-done (ops/op.h states
// the op runner's side of it).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "checkpoint/policy.h"
#include "engine/recompute_context.h"
#include "engine/tensor.h"

namespace remat {

struct CheckpointOptions {
  std::string name = "checkpoint";  // names the region in errors and reports
  bool reentrant = false;
  bool early_stop = true;           // non-reentrant only
  // The replay must save the same number of tensors with the same op names,
  // shapes and dtypes; a difference raises CheckpointMismatchError.
  bool determinism_check = true;
  // Also compare a checksum of each regenerated tensor's values (costs a pass
  // over every saved tensor in forward and replay).
  bool checksum = false;
  // Selective saving (non-reentrant; a reentrant region with a policy is an
  // Error): the outputs of ops the policy saves are kept from the forward,
  // and the replay reuses them instead of running those ops' kernels. Null:
  // recompute everything.
  Policy policy;
};

using RegionFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// Runs fn(inputs) as a checkpoint region and returns its outputs. Under
// no_grad it just runs fn. The region keeps a copy of `fn` and calls it again
// during backward, so whatever it captures must outlive the backward. `fn` must be deterministic given its inputs and
// the RNG state (random ops draw from the default generators, which the
// region stashes and restores for the replay).
std::vector<Tensor> checkpoint(const RegionFn& fn, const std::vector<Tensor>& inputs,
                               const CheckpointOptions& opts = {});
// One input, one output.
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input,
                  const CheckpointOptions& opts = {});

// What the checkpoint engine did on this thread.
struct CheckpointCounters {
  std::int64_t regions = 0;              // regions entered outside any replay
  std::int64_t replays = 0;              // region replays run
  std::int64_t early_stops = 0;          // replays cut short by early stop
  std::int64_t ops_recomputed = 0;       // ops dispatched inside replays
  std::int64_t tensors_regenerated = 0;  // saved tensors a replay produced
  std::int64_t bytes_regenerated = 0;
  std::int64_t ops_skipped = 0;          // op kernels a replay skipped (outputs cached by a policy)
  // Host wall time inside replays (outermost only), in nanoseconds. On CUDA
  // it is the time to enqueue the replay's work, not to run it.
  std::int64_t replay_ns = 0;
};
CheckpointCounters checkpoint_counters();
void reset_checkpoint_counters();

}  // namespace remat
