// The memory-budget solver behind `--recompute auto` (issue #19): given, for
// every block and every choice the plan syntax offers for it (keep its saves,
// a module region, the block as a region, offload, ...), what that choice
// keeps alive and what it costs, pick one choice per block so that the
// predicted peak fits a budget at the least predicted extra time. Exact (a
// dynamic program over blocks, the held bytes rounded up to a grid of
// `grid_bytes`, so a plan it calls feasible is feasible in the model), and
// the answer is a plan string `--recompute` accepts.
//
// Peak model. Backward runs the blocks last to first; while block i's
// backward runs, blocks 0..i-1 still hold what their choices keep:
//   block i forward:  block_forward_base + sum_{j<i} held_j + forward_work_i
//   forward end:      forward_base + sum_j held_j
//   block i backward: backward_base_i + sum_{j<i} held_j + held_i + work_i
//   elsewhere:        fixed_peak (the embedding, the optimizer step)
// where held is what a block keeps from its forward to its backward (all its
// saves, or a region's boundary, ...), forward_work the most its forward
// needs on top of what is held before it, and work the extra bytes its
// backward needs at once (the replayed saves of a region, gradient
// temporaries). The bases: persistent state plus what lives outside the
// blocks at those moments (embedding output, head, loss, the incoming
// gradient).
//
// Offload, compression and keep_gathered are one hook each with one block
// range in a plan string (offload@A-B), which acts on every block of the
// range: the choices that use one (PlanChoice::hooks) are taken on one
// contiguous run of blocks and every block of the run takes one. The solver tries every range (for
// both hooks together when their product of ranges is at most 4096; beyond,
// compression takes no range or every block), so the optimum is exact over
// the plans a string can write.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace remat {

// PlanChoice::hooks bits: the plan parts that take one block range.
// keep_gathered (--zero 3) is one too: its ranges are those that end at the
// last block (on blocks of one kind they dominate the others: the later a
// block, the fewer peaks its kept parameters add to), `none` and every
// block when the ranges of all three would exceed 4096 combinations.
inline constexpr unsigned kOffloadHook = 1, kCompressHook = 2, kKeepGatheredHook = 4;

struct PlanChoice {
  std::string component;  // the plan component for this block ("" keeps everything), e.g. "per_block"
  std::int64_t held = 0;  // bytes kept from the block's forward to its backward (>= 0)
  std::int64_t work = 0;  // extra bytes its backward needs at once
  double time_ms = 0;     // extra step time against keeping everything
  bool lossy = false;     // compression: only with allow_lossy
  unsigned hooks = 0;     // kOffloadHook / kCompressHook: the single-range hooks it uses
  std::int64_t forward_work = 0;  // the most its forward needs above what is held before it
};

struct PlannerInput {
  std::int64_t forward_base = 0;   // forward end (the head, the loss, the head's backward)
  std::int64_t backward_base = 0;  // every block's backward base, unless backward_bases is set
  std::vector<std::int64_t> backward_bases;  // per block (empty: backward_base)
  std::int64_t block_forward_base = 0;
  std::int64_t fixed_peak = 0;
  // choices[i]: the options of block i (at least one).
  std::vector<std::vector<PlanChoice>> choices;
  std::int64_t budget = 0;  // predicted peak must be <= this
  bool allow_lossy = false;
  std::int64_t grid_bytes = 0;  // 0: budget / 4096 (at least 1)
};

struct PlannerResult {
  bool feasible = false;
  std::vector<std::size_t> choice;  // per block, an index into choices[i]
  std::int64_t peak = 0;            // predicted (exact for the choices, not the grid)
  double time_ms = 0;               // predicted extra step time
  std::string plan;                 // the plan string ("none" when every block keeps all)
};

// The predicted peak of one choice per block (the model above).
std::int64_t predicted_peak(const PlannerInput& in, const std::vector<std::size_t>& choice);

// The least-time choices whose predicted peak fits in.budget (feasible =
// false if none does). Throws Error for an empty choice list.
PlannerResult solve_plan(const PlannerInput& in);

// The choices with the smallest predicted peak (ties: least time), for the
// error when a budget is below it.
PlannerResult smallest_peak_plan(const PlannerInput& in);

// One choice per block as a plan string: each part of a component ("per_block",
// "offload@..." of "per_block+offload") over the blocks that take it, one
// `part@A-B` per run of consecutive blocks (no range when a region or module
// part covers every block; offload and compression parts always carry
// theirs), in canonical order (RecomputePlan::str(): what a dump records).
std::string plan_string(const std::vector<std::vector<PlanChoice>>& choices, const std::vector<std::size_t>& choice);

}  // namespace remat
