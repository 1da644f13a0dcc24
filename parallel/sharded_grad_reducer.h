// Sharded gradient reduction (ZeRO stages 2 and 3): each unit's gradients
// are reduce-scattered over the group as soon as backward has produced the
// last of them, added into this rank's shard of the unit's summed gradient,
// and the parameters' full gradients freed at once; so a rank holds one
// unit's full gradients at a time plus its shards. Backward writes a unit's
// gradients straight into one flat buffer (the members' gradients are views
// of it: Tensor::set_grad_placement), which is what is reduce-scattered, so
// no second copy of the unit's gradients is made.
//
// Every rank must build the reducer with the same units in the same order
// and run the same graph, so units reduce in the same order everywhere
// (finish() checks it). Units whose readiness may differ between ranks
// (routed experts that no token reached) reduce in finish(), in unit order.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "parallel/process_group.h"
#include "parallel/shard_layout.h"

namespace remat {

struct ShardedUnit {
  ShardLayout layout;             // over the group's ranks
  std::vector<Tensor> params;     // the members: f32 leaves that require grad, in layout order
  bool ready_may_differ = false;  // reduce in finish(), not during backward
};

struct ShardedGradStats {
  std::int64_t reduce_scatters = 0;      // this step (a unit reduced again after a late gradient counts twice)
  std::int64_t started_in_backward = 0;  // ... of them started before backward returned
  std::int64_t bytes = 0;                // full f32 arrays reduce-scattered this step
  std::int64_t wait_ns = 0;              // time spent in the reduce-scatters (blocking: all of it exposed)
};

class ShardedGradReducer {
 public:
  ShardedGradReducer(std::vector<ShardedUnit> units, std::shared_ptr<ProcessGroup> group);
  ShardedGradReducer(const ShardedGradReducer&) = delete;
  ShardedGradReducer& operator=(const ShardedGradReducer&) = delete;

  // Before a step's first backward: every shard sum becomes 0 and the step's
  // counters restart.
  void zero();
  // Arms the hooks for the next backward (call before it).
  void prepare();
  // After that backward: reduces every unit that has not been reduced (or got
  // gradient after it was), frees the members' full gradients and checks
  // that every rank reduced in the same order (Error otherwise).
  void finish();

  std::size_t num_units() const { return units_.size(); }
  const ShardedUnit& unit(std::size_t u) const { return units_[u]; }
  // This rank's shard of unit u's summed gradient (f32, layout.shard elements).
  const Tensor& shard(std::size_t u) const { return shards_[u]; }
  ShardedGradStats stats() const { return stats_; }

 private:
  void on_ready(std::size_t unit, std::size_t member);
  Tensor place(std::size_t unit, std::size_t member);  // member's view of the unit's flat gradient
  Tensor take_flat(std::size_t unit);                   // the flat gradient, every member's part in it
  void reduce(std::size_t unit);

  std::vector<ShardedUnit> units_;
  std::shared_ptr<ProcessGroup> group_;
  std::vector<Tensor> shards_;
  std::vector<Tensor> flat_;               // per unit: its gradients this backward (undefined: none yet)
  std::vector<std::vector<bool>> ready_;   // per unit, per member (this backward)
  std::vector<std::int64_t> pending_;      // members not ready yet (this backward)
  std::vector<bool> reduced_, stale_;      // this backward
  std::vector<std::size_t> order_;         // units in the order reduced (this step)
  bool armed_ = false;
  ShardedGradStats stats_;
  std::shared_ptr<ShardedGradReducer*> self_ = std::make_shared<ShardedGradReducer*>(this);  // held weakly by hooks
};

}  // namespace remat
