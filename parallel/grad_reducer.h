// Data-parallel gradient reduction: gradients are summed over the ranks that
// hold the same parameter, in buckets of about `bucket_bytes`, each bucket
// started (asynchronously) as soon as backward has produced the last
// gradient in it, so communication overlaps the rest of backward.
//
// Buckets fill in reverse registration order (the order backward finishes
// parameters). Every rank must build the reducer with the same parameters
// in the same order and run the same graph, so buckets start in the same
// order everywhere. Parameters whose readiness may differ between ranks
// (routed experts, which get no gradient when no token reaches them) are
// reduced after backward in a fixed order instead.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/process_group.h"

namespace remat {

struct ReducedParameter {
  std::string name;
  Tensor param;                          // a leaf that requires grad
  std::shared_ptr<ProcessGroup> group;   // summed over these ranks (size 1: left alone)
  bool ready_may_differ = false;         // reduce after backward, not during it
};

struct GradReducerStats {
  std::int64_t buckets = 0;
  std::int64_t started_in_backward = 0;  // buckets started before backward ended (this step)
  std::int64_t bytes = 0;                // gradient bytes all-reduced (this step)
};

class GradReducer {
 public:
  GradReducer(std::vector<ReducedParameter> params, std::int64_t bucket_bytes);
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Arms the hooks for the next backward (call before it).
  void prepare();
  // After backward: starts what has not started, waits for everything and
  // writes the sums into every parameter's .grad (zeros where a rank had no
  // gradient). Throws Error if the ranks started their buckets in different
  // orders (their sums would have been mixed up).
  void finish();
  GradReducerStats stats() const { return stats_; }
  std::int64_t num_buckets() const { return std::int64_t(buckets_.size()); }

 private:
  struct Bucket {
    std::shared_ptr<ProcessGroup> group;
    std::vector<std::size_t> members;    // indices into params_
    std::vector<std::int64_t> offsets;   // element offset of each member
    Tensor flat;                         // f32, every member's gradient
    std::int64_t pending = 0;            // members not yet ready
    bool deferred = false;               // reduce in finish()
    bool stale = false;                  // a member got more gradient after the start
    std::shared_ptr<CommWork> work;
  };
  void on_ready(std::size_t param);
  void start(Bucket& b);

  std::vector<ReducedParameter> params_;
  std::vector<std::size_t> bucket_of_;   // per parameter (npos: not reduced)
  std::vector<bool> ready_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> start_order_;  // buckets in the order they started (this step)
  bool armed_ = false;
  GradReducerStats stats_;
  std::shared_ptr<GradReducer*> self_ = std::make_shared<GradReducer*>(this);  // what the hooks hold, weakly
};

}  // namespace remat
