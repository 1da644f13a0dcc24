// ZeRO-3's parameters: each rank keeps its shard of every unit's f32
// values (the master shard AdamW updates); a unit's parameters hold
// elements only while it is gathered (docs/PARALLEL.md#zero-3).
//
// A unit is gathered (all-gathered from the ranks' shards into one flat
// array the unit's parameters then alias) when it is about to run (its
// forward, or a recompute replay of it) or when backward first needs it
// (the gradient reaching a block's output, or a saved parameter being
// unpacked), and released after its forward and after backward has
// accumulated its gradients. Saves of a gathered parameter are kept as
// references to the unit, not as tensors, so the elements really go when
// the unit is released; unpacking one gathers the unit again if needed.
// So every plan, recompute or not, gathers a block twice a step (forward,
// then backward with its replay), never more.
//
// Prefetch: gathering a unit for its forward starts the gather of the next
// unit (nonblocking: ProcessGroup::all_gather_async); gathering one for its
// backward starts the previous block's. So at most two units are gathered
// at once, and each gather overlaps the compute of the unit before it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/block_stack.h"
#include "parallel/process_group.h"
#include "parallel/shard_layout.h"

namespace remat {

class UnitGatherer : public UnitRunHooks, public std::enable_shared_from_this<UnitGatherer> {
 public:
  struct Unit {
    ShardLayout layout;
    std::vector<Tensor> params;       // released unless gathered
    Tensor master;                    // this rank's shard of the values (f32, layout.shard)
    std::vector<bool> counted;        // members whose gradient tells the end of the unit's backward
    // The gathered values' dtype: f32 (the parameters alias the gathered
    // array), or bf16/f16 under mixed precision for a unit whose members the
    // layers read only through weight_as: each rank casts its shard and the
    // gather moves half the bytes; the parameters keep no values and the
    // layers get the gathered copies (set_gathered_copy), the bits casting
    // the f32 values gives.
    DType dtype = DType::f32;
  };
  // Takes the units (params currently holding their values, which are
  // released here); every rank of `group` builds the same units.
  UnitGatherer(std::vector<Unit> units, std::shared_ptr<ProcessGroup> group);
  ~UnitGatherer() override;  // releases every unit (no gathered copy outlives it)
  UnitGatherer(const UnitGatherer&) = delete;
  UnitGatherer& operator=(const UnitGatherer&) = delete;
  // Installs the post-accumulate hooks that release a unit after its
  // backward (call once, after construction, holding a shared_ptr).
  void install();
  // Reads the keep_gathered component of `stack`'s plan (its blocks are not
  // released after their forward) from now on; the stack must outlive the
  // calls (it holds this gatherer as its unit hooks). Null: release all.
  void follow_plan(const BlockStack* stack) { stack_ = stack; }

  // UnitRunHooks
  void before_run(const std::string& unit) override;
  void after_run(const std::string& unit, const Tensor& y) override;
  std::shared_ptr<SavedTensorHooks> save_hooks() override { return saves_; }

  // Gathers unit u (nothing if it is gathered; waits for its prefetch if
  // one was started).
  void gather(std::size_t u);
  // Starts gathering unit u without waiting (nothing if it is gathered or
  // started).
  void prefetch(std::size_t u);
  // Releases unit u (nothing if it is not gathered).
  void release(std::size_t u);
  // Releases every gathered unit (after a step's backward).
  void release_all();
  bool gathered(std::size_t u) const { return units_[u].flat.defined(); }
  // Unit u's gathered dtype from its next gather (Unit::dtype; f32, bf16 or
  // f16); Error while it is gathered or being gathered.
  void set_dtype(std::size_t u, DType dtype);
  std::size_t num_units() const { return units_.size(); }
  const Tensor& master(std::size_t u) const { return units_[u].master; }
  const ShardLayout& layout(std::size_t u) const { return units_[u].layout; }
  // The bytes one gathered copy of unit u takes (padded, in its dtype).
  std::int64_t gathered_bytes(std::size_t u) const {
    return units_[u].layout.padded() * std::int64_t(element_size(units_[u].dtype));
  }
  // Gathers counted since construction, and the time spent waiting for
  // them (a gather that had not finished when its unit was needed: the
  // communication not hidden behind compute).
  std::int64_t gathers() const { return gathers_; }
  std::int64_t wait_ns() const { return wait_ns_; }

 private:
  struct State : Unit {
    Tensor flat;                 // the gathered values (undefined: released)
    Tensor incoming;             // a prefetch's output, until gather() takes it
    Tensor sent;                 // the shard cast to dtype, while its gather is under way
    std::shared_ptr<CommWork> work;  // the prefetch under way
    std::vector<bool> got;       // per member: its gradient arrived since the gather
    std::int64_t pending = 0;    // counted members whose gradient has not arrived since the gather
  };
  class SaveRefs;
  std::size_t index(const std::string& unit) const;  // npos when not a sharded unit
  void on_grad(std::size_t u, std::size_t member);
  void gather_for_backward(std::size_t u);  // gather, and prefetch the block before it
  void progress();                          // lets started prefetches move

  std::vector<State> units_;
  std::map<std::string, std::size_t> by_name_;
  std::shared_ptr<ProcessGroup> group_;
  const BlockStack* stack_ = nullptr;
  std::shared_ptr<SavedTensorHooks> saves_;  // a SaveRefs
  std::int64_t gathers_ = 0, wait_ns_ = 0;
};

}  // namespace remat
