// The block-stack interface: a model's repeated blocks, run in order under a
// recompute plan (checkpoint/plan.h: every `--recompute` value of
// docs/RECOMPUTE.md#plans). The decoder's layers are one (models/decoder.h); a
// user's model built from Blocks in a BlockStack takes every plan string the
// same way (examples/custom_model.cpp).
//
//   class MyBlock : public Block {            // x -> x + mlp(norm(x))
//     Tensor forward(const Tensor& x) const override {
//       Tensor n = region("norm", [this](const Tensor& t) { return norm->forward(t); }, x);
//       return add(x, region("mlp", [this](const Tensor& t) { return mlp->forward(t); }, n));
//     }
//     std::vector<std::string> sub_regions() const override { return {"norm", "mlp"}; }
//     ...
//   };
//   stack->add_block("0", std::make_shared<MyBlock>(...));
//   stack->set_plan("uniform:2");   // or per_block, selective:mlp, selective:save_matmul, ...
//   Tensor h = stack->forward(x);
#pragma once

#include <any>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/compress.h"
#include "checkpoint/dynamic_remat.h"
#include "checkpoint/offload.h"
#include "checkpoint/plan.h"
#include "models/layers.h"
#include "models/module.h"

namespace remat {

// One block of a stack: x -> y of the same shape. The block's forward must be
// deterministic given its input and the RNG state (it may be replayed).
class Block : public Module {
 public:
  virtual Tensor forward(const Tensor& x) const = 0;
  // The sub-region names this block offers to plans (selective:NAME, and the
  // decoder's own "attention", "moe_expert"). Default: none.
  virtual std::vector<std::string> sub_regions() const { return {}; }
  // Which sub-regions run as checkpoint regions from now on (BlockStack::
  // set_plan calls it with the plan's module regions; empty: none). A block
  // with more per-plan state of its own (the decoder's moe_act) overrides
  // it, calling Block::set_regions first.
  virtual void set_regions(const std::set<std::string>& names);
  const std::set<std::string>& regions() const { return regions_; }
  // Runs a named part as a checkpoint region (named after the part) when it
  // is in regions(), under the part's save hooks when it has some, else
  // directly. The block owns it; child modules that run named parts of
  // their own take it by reference in their forward (models/layers.h).
  const PartRunner& part_runner() const { return parts_; }
  // What this block's forward hands out besides its output that backward
  // differentiates (the decoder's MoE blocks: the router's aux and z
  // losses, which the model adds to the loss); empty: nothing. A reentrant
  // region differentiates only its outputs, so BlockStack::set_plan refuses
  // one over a block that names some.
  virtual std::string side_outputs() const { return {}; }
  // True if the plan runs part `name` as a region or under save hooks (a
  // block may fuse ops across parts only where neither is the case).
  bool part_wrapped(const std::string& name) const { return regions_.count(name) || part_hooks_.count(name); }
  // Saved-tensor hooks (outermost first) to run named parts under (the
  // plan's offload:NAMES / compress:FMT:NAMES); part_runner() reads them
  // (and regions()) when a part runs.
  void set_part_hooks(std::map<std::string, std::vector<std::shared_ptr<SavedTensorHooks>>> hooks) {
    part_hooks_ = std::move(hooks);
  }

 protected:
  // Runs fn(inputs) as checkpoint region `name` when the plan names it, else
  // directly. `fn` may be replayed during backward: what it captures must
  // outlive the backward (the block's `this` does).
  std::vector<Tensor> region(const std::string& name, const RegionFn& fn, const std::vector<Tensor>& inputs) const;
  // One input, one output.
  Tensor region(const std::string& name, const std::function<Tensor(const Tensor&)>& fn, const Tensor& x) const;

 private:
  // The PartRunner of this block's parts: regions_ and part_hooks_ as they
  // are when a part runs (a replay during backward included).
  class Parts final : public PartRunner {
   public:
    explicit Parts(const Block& block) : block_(block) {}
    std::vector<Tensor> run(const std::string& part, const RegionFn& fn,
                            const std::vector<Tensor>& inputs) const override;

   private:
    const Block& block_;
  };

  std::set<std::string> regions_;
  std::map<std::string, std::vector<std::shared_ptr<SavedTensorHooks>>> part_hooks_;
  Parts parts_{*this};
};

// Watches a stack's forward block by block (the planner's profile,
// train/auto_plan.h). Not called inside recompute replays.
class BlockObserver {
 public:
  virtual ~BlockObserver() = default;
  // Block i is about to run on x (for a block-level region: inside it).
  virtual void before_block(std::int64_t i, const Tensor& x) = 0;
  // Block i returned y.
  virtual void after_block(std::int64_t i, const Tensor& y) = 0;
};

// Where a model's parameters come from when they are not always resident
// (ZeRO-3, train/zero.h: sharded over ranks, gathered one unit at a time).
// A unit is a block of a stack ("block.<i>") or a part of the model around
// the stack (the decoder's "embed" and "head").
class UnitRunHooks {
 public:
  virtual ~UnitRunHooks() = default;
  // Unit `unit` is about to run: its original forward, or a recompute
  // replay of it (in_recompute()).
  virtual void before_run(const std::string& unit) = 0;
  // Unit `unit` returned `y` (in_recompute(): a replay).
  virtual void after_run(const std::string& unit, const Tensor& y) = 0;
  // Saved-tensor hooks active around the whole forward (outermost), so a
  // save of a parameter can be kept as a reference to its unit; null: none.
  virtual std::shared_ptr<SavedTensorHooks> save_hooks() { return nullptr; }
};

// RAII: calls hooks->before_run(unit) (hooks may be null: nothing); done(y)
// calls after_run and returns y.
class UnitRun {
 public:
  UnitRun(UnitRunHooks* hooks, std::string unit);
  Tensor done(Tensor y);
  UnitRun(const UnitRun&) = delete;
  UnitRun& operator=(const UnitRun&) = delete;

 private:
  UnitRunHooks* hooks_;
  std::string unit_;
};

// Side outputs (Block::side_outputs) through a reentrant region, whose
// backward differentiates only the region's outputs: the region's function
// captures what its blocks hand out and returns it as extra outputs, and the
// stack then hands the region's versions (which carry its history) on to
// where the blocks would have put them. The model that knows where that is
// provides it (the decoder: its MoE layers' router losses).
class SideOutputChannel {
 public:
  virtual ~SideOutputChannel() = default;
  // Runs `run` with the side outputs it makes captured and returns them, as
  // many on every run of the same blocks. With `keep`, also stores there
  // what else the run reports (the original run's metrics; a replay passes
  // null and reports nothing).
  virtual std::vector<Tensor> capture(const std::function<void()>& run, std::any* keep) = 0;
  // Hands on `outputs` (what capture returned, as the region returned them)
  // with what capture kept.
  virtual void emit(std::vector<Tensor> outputs, std::any kept) = 0;
};

// Blocks in order, each a named child module (parameter names
// "<stack's name>.<block's name>.<parameter>"), run under a recompute plan.
class BlockStack : public Module {
 public:
  // Appends `block` under `name` (unique, non-empty, no '.') and returns it.
  // Add every block before setting a plan.
  template <typename B>
  std::shared_ptr<B> add_block(const std::string& name, std::shared_ptr<B> block) {
    static_assert(std::is_base_of_v<Block, B>, "BlockStack::add_block: B must derive from remat::Block");
    check_new_block(name, block.get());
    blocks_.emplace_back(name, block);
    return register_module(name, std::move(block));
  }
  std::int64_t num_blocks() const { return std::int64_t(blocks_.size()); }
  // Block i (0 <= i < num_blocks(), else Error) and its name.
  const Block& block(std::int64_t i) const;
  Block& block(std::int64_t i);
  const std::string& block_name(std::int64_t i) const;
  // Every sub-region name some block offers, first-offered first, once each.
  std::vector<std::string> sub_regions() const;

  // Runs every block in order on x under the current plan: block-level
  // regions ("block 3", "blocks 0-1") with the plan's op policy; blocks
  // outside them run plainly (their sub-regions as the plan says).
  Tensor forward(const Tensor& x) const;
  // Blocks [begin, end) only (a pipeline stage), under the same plan; a
  // block-level region that crosses the range is an Error naming it.
  Tensor forward(const Tensor& x, std::int64_t begin, std::int64_t end) const;

  // Makes the stack run with `plan` from now on (replacing any earlier one).
  // Throws Error if the plan was parsed for more blocks than the stack has,
  // names a sub-region no block offers (naming it, the blocks' names and
  // the valid forms), asks for chunked_loss in a model that declared no
  // LM head (set_has_lm_head), or puts a block with side outputs
  // (Block::side_outputs) in a reentrant region of a stack with no
  // set_side_outputs channel.
  void set_plan(const RecomputePlan& plan);
  // Parses `spec` for this stack (num_blocks(), the blocks' sub_regions())
  // and sets it; parse errors as RecomputePlan::parse.
  void set_plan(const std::string& spec);
  const RecomputePlan& plan() const { return plan_; }
  // The model around the stack ends in an LM head and cross-entropy that
  // runs the plan's chunked_loss (the decoder's does); default false.
  void set_has_lm_head(bool yes) { has_lm_head_ = yes; }
  // Where the blocks' side outputs go when a reentrant region holds them
  // (null: nowhere, and such a plan is refused).
  void set_side_outputs(std::shared_ptr<SideOutputChannel> channel) { side_ = std::move(channel); }
  // Calls `observer` around every block's forward from now on (null: none).
  void set_observer(std::shared_ptr<BlockObserver> observer) { observer_ = std::move(observer); }
  // Calls `hooks` around every run of a block (replays included) from now
  // on, and keeps its save hooks active with the plan's (null: none). A
  // model around the stack calls them for its own units (unit_hooks()).
  void set_unit_hooks(std::shared_ptr<UnitRunHooks> hooks) { unit_hooks_ = std::move(hooks); }
  UnitRunHooks* unit_hooks() const { return unit_hooks_.get(); }

  // The plan's offload and compression hooks (null when the plan has none),
  // for their statistics and checks. Setting plans one after another keeps
  // one spill file and I/O thread for all that offload into the same folder
  // (their statistics add up).
  const std::shared_ptr<OffloadHooks>& offload_hooks() const { return offload_; }
  const std::shared_ptr<CompressHooks>& compress_hooks() const { return compress_; }
  // The plan's dynamic rematerialization (null without `dynamic`): the
  // runtime a step activates with a DynamicRematScope around its forward
  // and backward (checkpoint/dynamic_remat.h), on the device its first
  // recorded op call runs on. A later plan with the same budget keeps it
  // (its counters run on).
  const std::shared_ptr<DynamicRemat>& dynamic_remat() const { return dynamic_; }

  // RAII: the plan's whole-model save hooks active on this thread, so saves
  // outside the blocks (an embedding, a head, a loss) get them too. forward()
  // opens one itself; a nested one for the same stack does nothing.
  class SaveHooksScope {
   public:
    explicit SaveHooksScope(const BlockStack& stack);
    ~SaveHooksScope();
    SaveHooksScope(const SaveHooksScope&) = delete;
    SaveHooksScope& operator=(const SaveHooksScope&) = delete;

   private:
    const BlockStack* stack_ = nullptr;  // set when this scope opened the hooks
    std::vector<std::unique_ptr<SavedTensorHooksScope>> scopes_;
  };

 private:
  void check_new_block(const std::string& name, const Block* block) const;
  // set_plan's checks of what `plan` asks of this stack's blocks and model.
  void check_plan(const RecomputePlan& plan) const;
  const Block& at(std::int64_t i) const;
  std::vector<std::pair<std::string, std::shared_ptr<Block>>> blocks_;
  RecomputePlan plan_;
  std::shared_ptr<OffloadHooks> offload_;     // one spill file and I/O thread per stack
  std::shared_ptr<OffloadHooks> spare_offload_;  // the last one made, kept for later plans
  std::shared_ptr<CompressHooks> compress_;
  std::shared_ptr<DynamicRemat> dynamic_;
  bool offload_whole_ = false, compress_whole_ = false;  // around the whole forward (else per part)
  bool has_lm_head_ = false;
  std::vector<std::int64_t> region_of_;  // block -> index into plan_.block_regions, or -1
  std::shared_ptr<BlockObserver> observer_;
  std::shared_ptr<UnitRunHooks> unit_hooks_;
  std::shared_ptr<SideOutputChannel> side_;
  Tensor run_block(std::int64_t i, const Tensor& x) const;  // block i's forward, observed
  // Runs block-level region r of the plan (blocks `group`) on h.
  Tensor run_region(std::size_t r, const std::vector<std::int64_t>& group, const Tensor& h) const;
};

}  // namespace remat
