// Sharded data parallel (ZeRO) over the data-parallel ranks of a run: the
// parameters are cut into units (a decoder block each; the embedding and
// the head with the final norm are units of their own), each unit laid flat
// and sharded over the ranks (parallel/shard_layout.h).
//
//   stage 1: each rank keeps AdamW's state for its shard of every unit only
//            and updates only that shard; the updated shards are then
//            all-gathered into every rank's parameters. Gradients are
//            all-reduced whole, as without ZeRO.
//   stage 2: also the gradients: each unit's gradients are reduce-scattered
//            as soon as backward has produced them (parallel/
//            sharded_grad_reducer.h) and each rank keeps its shard only.
//   stage 3: also the parameters: each rank keeps its shard of every unit's
//            values (what AdamW updates); a unit is gathered just before it
//            runs and released after (train/zero_gather.h).
//
// Parameters that are not sharded (the routed experts under expert
// parallelism, already split by expert) are updated whole, as AdamW does.
// docs/PARALLEL.md#sharded-data-parallel-zero.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "models/decoder.h"
#include "parallel/process_group.h"
#include "parallel/sharded_grad_reducer.h"
#include "train/optimizer.h"
#include "train/parallel_layout.h"
#include "train/zero_gather.h"

namespace remat {

// The dtype ZeRO-3 gathers units in: the compute dtype, except for a unit
// with a member some op reads as f32 (by name), which gathers in f32.
struct GatherPrecision {
  DType compute = DType::f32;
  std::set<std::string> f32_reads;
};
// The model's: its compute dtype and DecoderModel::f32_read_parameters().
GatherPrecision gather_precision(const DecoderModel& model);

// The unit a parameter of a decoder model shards with: "embed" for
// model.embed_tokens.*, "block.N" for model.layers.N.*, "head" for the rest
// (the final norm and the LM head).
std::string shard_unit_name(const std::string& param_name);

// Whether ZeRO shards parameter `name` over the data-parallel ranks: every
// parameter but the routed experts under expert parallelism (`ep` > 1),
// which stay whole, split by expert already.
bool zero_shards_parameter(std::int64_t ep, const std::string& name);

// Error naming --zero for a stage other than 0 (none), 1, 2 or 3.
void check_zero_stage(std::int64_t stage);

// Fills `out` (contiguous f32 on the CPU) with elements [begin, begin +
// out.numel()) of parameter `name`'s flattened initial values: a rank builds
// its shards without the whole parameter (models/layers.h: InitRecipe).
using ParameterRangeSource = std::function<void(const std::string& name, std::int64_t begin, Tensor& out)>;

class ZeroOptimizer {
 public:
  // `params`: this rank's parameters (f32 leaves that require grad) in the
  // model's order; `sharded(name)`: whether a parameter is sharded over
  // `group` (the others are updated whole); `ready_may_differ(name)`:
  // whether its gradient's readiness may differ between ranks (its unit then
  // reduces after backward). Every rank of `group` builds the same units.
  // `initial` (stage 3 only; null: the parameters' values): where the
  // shards' values come from, the parameters then holding none (released:
  // a model built on meta); the unsharded parameters get theirs whole.
  ZeroOptimizer(int stage, const std::vector<std::pair<std::string, Tensor>>& params,
                std::shared_ptr<ProcessGroup> group, const std::function<bool(const std::string&)>& sharded,
                const std::function<bool(const std::string&)>& ready_may_differ, AdamWOptions opts,
                const ParameterRangeSource& initial = nullptr);
  // Stage 3: the dtype each unit gathers in from now on (before a step).
  void set_gather_precision(const GatherPrecision& precision);
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  int stage() const { return stage_; }
  // Stages 2 and 3: the reducer a training step zeroes at its start and
  // arms around its backward passes; null for stage 1.
  ShardedGradReducer* grad_reducer() const { return reducer_.get(); }
  // Stage 3: the gatherer the model's block stack runs its units under
  // (BlockStack::set_unit_hooks); null otherwise.
  const std::shared_ptr<UnitGatherer>& gatherer() const { return gatherer_; }
  // The tensors whose .grad the update reads, with their gradients bound to
  // this step's: the pieces of this rank's shards (flat views of the
  // parameters; their gradients views of the whole gradients under stage 1,
  // of the reduced shards under stage 2), then the unsharded parameters.
  // Call after backward (and the reductions), before clipping and step().
  const std::vector<Tensor>& bind_grads();
  // The pieces alone (bound by the last bind_grads()).
  std::vector<Tensor> shard_pieces() const;
  // The parameter each of shard_pieces() is a piece of, in the same order.
  std::vector<std::string> shard_piece_parameters() const;
  // The unsharded parameters.
  const std::vector<Tensor>& unsharded() const { return unsharded_; }
  // AdamW on this rank's pieces and the unsharded parameters; then, under
  // stages 1 and 2, every unit's shards all-gathered into every rank's
  // parameters (stage 3 gathers them when they next run).
  void step(double lr);
  // The parameters' values in the model's order (stage 3: every unit's
  // shards gathered, a collective); the parameters themselves otherwise.
  std::vector<std::pair<std::string, Tensor>> parameter_values() const;
  // Stage 3: sets this rank's shards of the parameters from `values` (a
  // state in one process's layout, read by range; names and shapes checked
  // beforehand by the caller): only the rank's ranges are read. The
  // unsharded parameters, and every parameter under stages 1 and 2, are the
  // caller's to load whole.
  void load_parameters(const ParameterRangeSource& values);
  std::int64_t steps() const { return adamw_->steps(); }

  // The optimizer state in one process's layout (AdamW::state()'s names and
  // shapes, every unit's shards gathered); a collective over the group.
  std::vector<std::pair<std::string, Tensor>> one_process_state() const;
  // This rank's pieces for a sharded save (train/sharded_state.h): the
  // parameters' and their optimizer state's, "<tensor>@<first element>" of
  // the flattened tensor, 1-D.
  std::vector<std::pair<std::string, Tensor>> shard_pieces_named() const;
  // The unsharded parameters and their optimizer state (AdamW::state()'s names).
  std::vector<std::pair<std::string, Tensor>> unsharded_named() const;
  // Takes this rank's shards of the optimizer state from `values` (a state
  // in one process's layout, as one_process_state() returns and AdamW
  // saves, read by range: only the rank's ranges of each moment, the
  // unsharded parameters' moments whole). The caller checks the names and
  // shapes beforehand; an exception from `values` leaves the state partly
  // loaded.
  void load_state(const ParameterRangeSource& values, std::int64_t step);
  // The ranges load_parameters and load_state read, {name, first element,
  // count} of the one-process tensors (a caller verifies them first).
  struct StateRange {
    std::string name;
    std::int64_t begin, n;
  };
  std::vector<StateRange> loaded_ranges() const;
  // What this rank keeps across steps: the parameters, their gradients
  // (whole under stage 1; the shards and the unsharded ones' under stage 2)
  // and the optimizer state.
  std::int64_t persistent_bytes() const;
  // What the sharding itself holds at its fullest under any plan, on top of
  // persistent_bytes(): stage 3 the most over the units of a unit's backward
  // (it and the unit before it, prefetched, gathered, and its flat f32
  // gradient before the reduce-scatter) and forward (it and the next one
  // gathered); stage 2 the largest unit's flat gradient; stage 1 nothing.
  std::int64_t working_bytes() const;
  // The parameter elements this rank holds across steps: under stage 3 its
  // shards (padding included) and the unsharded parameters, else all.
  std::int64_t held_parameters() const;

 private:
  struct Unit {
    ShardLayout layout;
    std::vector<Tensor> params;
    std::vector<ShardPiece> pieces;  // this rank's
    std::vector<Tensor> views;       // per piece: a flat view of its parameter
  };
  std::string piece_name(const Unit& u, const ShardPiece& p) const;
  // Stage 3: unit u's shard on `rank`, from the parameters or `initial`.
  // AdamW over this rank's pieces (its moments one buffer per unit) and the
  // unsharded parameters.
  void make_adamw(AdamWOptions opts);
  // Fills `master` (a unit's shard) from `values`, its padding zeroed.
  void fill_master(const Unit& u, Tensor& master, const ParameterRangeSource& values) const;
  Tensor make_master(const Unit& u, int rank, const ParameterRangeSource& initial) const;
  // The unsharded parameters' values, whole, from `initial`.
  void fill_unsharded(const ParameterRangeSource& initial);

  int stage_;
  std::shared_ptr<ProcessGroup> group_;
  std::vector<Unit> units_;
  std::vector<std::pair<std::string, Tensor>> all_params_;
  std::vector<Tensor> unsharded_;
  std::vector<std::string> unsharded_names_;
  std::unique_ptr<ShardedGradReducer> reducer_;
  std::shared_ptr<UnitGatherer> gatherer_;
  std::vector<Tensor> masters_;  // stage 3: per unit, this rank's shard of the values
  std::unique_ptr<AdamW> adamw_;
  std::vector<Tensor> bound_;
};

// The update of a data-parallel run on `layout` (the trainer's, and mem's):
// the reducer of whole gradients, and AdamW (stage 0) or a ZeroOptimizer.
// Under ZeRO the routed experts of an expert-parallel layout stay whole
// (split by expert already, reduced over their replicas); stage 1 reduces
// every gradient whole, stages 2 and 3 the unsharded ones only. Stage 3
// puts the gatherer on `model`'s block stack (BlockStack::set_unit_hooks),
// gathering in gather_precision(model). Error for a
// stage > 0 on one rank. `initial`: as ZeroOptimizer's (stage 3 only).
// The gradients the update keeps whole are allocated here, before any
// activation (give_gradient_buffers, train/optimizer.h).
struct DataParallelUpdate {
  std::unique_ptr<GradReducer> reducer;  // null when nothing is reduced whole (or one rank)
  std::unique_ptr<AdamW> adamw;          // stage 0
  std::unique_ptr<ZeroOptimizer> zero;   // stages 1-3

  // The start of a step (bench, the planner's profile), after the model's
  // zero_grad(): the sharded gradients (stages 2 and 3) zeroed.
  void zero_shards();
  // Its backward: the reducers armed around loss.backward(seed) (seed
  // `seed_scale`: 1/W for the mean over W ranks; 1 is the default seed),
  // then every unit stage 3 still holds released.
  void backward(const Tensor& loss, double seed_scale);
  // Its update: the gradients clipped to norm `clip` (under ZeRO this rank's
  // shards' norm: the figures are times and bytes, not the trainer's global
  // norm) and AdamW at `lr`. `params`: the parameters stage 0 updates.
  void step(const std::vector<Tensor>& params, double clip, double lr);
  // What the rank keeps across steps: parameters, gradients and optimizer
  // state (ZeroOptimizer::persistent_bytes under ZeRO).
  std::int64_t persistent_bytes(const std::vector<std::pair<std::string, Tensor>>& params) const;
  // ZeroOptimizer::working_bytes under ZeRO, else 0.
  std::int64_t working_bytes() const { return zero ? zero->working_bytes() : 0; }
};
DataParallelUpdate make_data_parallel_update(const ParallelLayout& layout,
                                             const std::vector<std::pair<std::string, Tensor>>& params,
                                             std::int64_t bucket_bytes, std::int64_t zero, AdamWOptions opts,
                                             DecoderModel& model, const ParameterRangeSource& initial = nullptr);

}  // namespace remat
