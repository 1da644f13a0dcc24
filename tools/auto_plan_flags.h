// `--recompute auto` on the command line (train, dump, mem, bench, plan):
// the flags it takes and the step that turns it into a plan string.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/device.h"
#include "checkpoint/plan.h"
#include "models/config.h"
#include "tools/args.h"
#include "train/auto_plan.h"

namespace remat::tools {

// --memory-budget B (bytes with a unit, or N%), --allow-lossy,
// --profile-rounds N.
std::vector<FlagSpec> auto_plan_flag_specs();
// `specs` and the above.
std::vector<FlagSpec> with_auto_plan_flags(std::vector<FlagSpec> specs);

// --simulate-world dp=D,ep=E,pp=P and --simulate-rank R (mem, plan): one
// rank of a job that is not running, on meta (docs/META.md).
std::vector<FlagSpec> simulate_flag_specs();
struct SimulatedRank {
  WorldSpec world;
  int rank = 0;
};
// The flags' simulated rank (nullopt without --simulate-world). Error for
// --simulate-rank without --simulate-world, a bad spec, a rank outside the
// job, or a device other than meta (naming the command and the flag).
std::optional<SimulatedRank> simulated_rank_flags(const Flags& f, Device device);
// The global batch of a simulated job when --batch is not given: the
// config's batch is what one rank runs per micro-batch, so batch x dp x
// micro_batches.
void scale_simulated_batch(ModelConfig& c, const SimulatedRank& r, std::int64_t micro_batches);

// How the ranks of a job under mpirun run the step the profile measures
// (train's --ep, --zero, --pp): the profile runs on every rank together.
struct ProfileJob {
  std::int64_t ep = 1, zero = 0, pp = 1, tp = 1;
  bool sp = false;
};

// The profile options for `c` from the flags' --profile-rounds,
// --allow-lossy, --offload-dir and simulated rank, a progress line on
// stderr per step when `verbose`. Under mpirun (more than one rank) the
// profile runs on the job's ranks as `job` says; Error naming the command
// for a pipeline (pp > 1), which is not planned.
ProfileOptions profile_options_for_flags(const Flags& f, const ModelConfig& c, const std::string& dtype, Device device,
                                         std::uint64_t seed, bool verbose, const ProfileJob& job = {});

// choose_checked_plan for --memory-budget `budget_text` (--allow-lossy from
// the flags). Throws Error when no plan fits, or when the plan run measured
// above the budget and no tighter plan exists (naming both).
CheckedPlan checked_choice(const Flags& f, const PlanProfile& prof, const ProfileOptions& opts,
                           const std::string& budget_text);

// The --recompute value to run: `recompute` itself, or for "auto" the plan
// chosen for --memory-budget from a profile of `c` (one line about it on
// rank 0's stdout; under mpirun every rank profiles and chooses the same,
// as `job` runs). Throws Error when auto has no --memory-budget, when a
// budget is given to a plan that is not auto, and when no plan fits (naming
// the smallest predicted peak and its plan).
std::string resolve_recompute(const Flags& f, const std::string& recompute, const ModelConfig& c,
                              const std::string& dtype, Device device, std::uint64_t seed,
                              const ProfileJob& job = {});

// A plan with `dynamic` and no budget (checkpoint/plan.h): its budget from
// --memory-budget (bytes with a unit, or N% of plan none's activation bytes
// above the persistent bytes, from a profile of none alone); returns the
// plan with dynamic:BYTES, and says so on rank 0's stdout. Error without
// --memory-budget.
std::string resolve_dynamic(const Flags& f, RecomputePlan plan, const ModelConfig& c, const std::string& dtype,
                            Device device, std::uint64_t seed, const ProfileJob& job = {});
// The bytes --memory-budget means for dynamic (as above).
std::int64_t dynamic_budget_bytes(const Flags& f, const ModelConfig& c, const std::string& dtype, Device device,
                                  std::uint64_t seed, const ProfileJob& job = {});

// train --recompute auto --tune-microbatch: the plan and the micro-batches per
// step together. For every micro-batch count M that divides the batch (1, 2,
// 4, ...: powers of two) the config at batch / M is profiled and a plan
// chosen and checked for the budget; the pair with the least predicted step
// time (M micro-steps) wins. Prints one line per M and the choice; sets
// *grad_accum. Errors as resolve_recompute, and when no M fits.
std::string resolve_recompute_and_microbatch(const Flags& f, const ModelConfig& c, const std::string& dtype,
                                             Device device, std::uint64_t seed, std::int64_t* grad_accum);

}  // namespace remat::tools
