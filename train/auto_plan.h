// `--recompute auto --memory-budget B` (issue #19): a measured profile of
// the model's training step under each plan component, the cost tables the
// solver (checkpoint/planner.h) takes from it, and the plan it chooses.
//
// Profile. One process, one model, the bench worker's step (forward, loss,
// backward, gradient clipping, AdamW). Each candidate component runs on every
// block in turn (rounds in a rotating order, the first a warm-up, which for
// `none` also traces every saved tensor); a BlockObserver and gradient hooks
// on the block boundaries record, per block, the allocated bytes before and
// after its forward and the peak inside it, the bytes at the start of its
// backward and the peak inside it, and the time of both. From these (medians
// over the rounds), per block and candidate: held = what the forward leaves
// allocated, forward_work / work = its forward / backward peak above the
// model's base (planner.h), time = its extra forward + backward time against
// `none`, plus its share of the rest of the step's change. Measured, not
// counted from FLOPs: a memory-bound op's replay is cheap, a GEMM's is not,
// and offload's I/O shows where it costs.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/planner.h"
#include "engine/device.h"
#include "models/config.h"
#include "parallel/process_group.h"
#include "train/parallel_layout.h"

namespace remat {

// One saved tensor of the traced `none` step.
struct ProfiledSave {
  std::int64_t block = -1;  // -1: outside the blocks (embedding, head, loss)
  std::string op;
  std::int64_t bytes = 0;
  bool is_output = false;   // the op saved its own output
  std::int64_t saved_at = 0, released_at = 0;  // event indices: saves and releases of the step, in order
};

// A candidate measured on every block.
struct ProfiledCandidate {
  std::string component;          // as in PlanChoice ("" keeps everything)
  std::string plan;               // the plan string measured (the component on every block)
  bool lossy = false;
  unsigned hooks = 0;
  std::vector<PlanChoice> blocks; // per block: its costs (component, held, work, forward_work, time_ms)
  double step_ms = 0;             // measured step time (median)
  std::int64_t peak = 0;          // measured peak allocated (the highest round)
  // MoE: bytes the dispatch/combine moved in the forward, and again in
  // recompute replays (what a replay repeats), in the highest round.
  std::int64_t dispatch_bytes = 0, replay_dispatch_bytes = 0;
};

// The step under chunked_loss (no block plan): the planner's bases with the
// loss chunked, and what chunking costs. A plan string may add chunked_loss
// to any block plan; the blocks' own costs do not depend on it.
struct ChunkedLossProfile {
  bool measured = false;  // the profile ran it (a model with an LM head)
  std::int64_t forward_base = 0, block_forward_base = 0, fixed_peak = 0;
  std::vector<std::int64_t> backward_bases;
  std::int64_t loss_peak = 0;  // MemoryCategory::loss's peak in its step
  double extra_ms = 0;         // its step time less none's (>= 0)
};

// --zero 3: what keep_gathered changes on each block against releasing its
// gathered parameters after its forward, from the step with keep_gathered
// on every block: held (the unit's gathered bytes kept), forward_work and
// work, and time_ms (< 0: the backward's gather saved). planner_input
// offers every choice of a block also with it (hook kKeepGatheredHook)
// where it saves time.
struct KeepGatheredProfile {
  bool measured = false;
  std::vector<PlanChoice> delta;  // per block
};

struct PlanProfile {
  std::string config;
  std::int64_t n_blocks = 0;
  std::vector<bool> moe_blocks;   // per block: an MoE block (MoE components apply only there)
  std::int64_t persistent = 0;    // parameters + gradients + optimizer state
  // Under --zero 2/3: what the sharding holds at a block's backward under
  // every plan (DataParallelUpdate::working_bytes: gathered units and one
  // unit's gradients), which is neither persistent nor an activation.
  std::int64_t sharding_working = 0;
  std::int64_t none_peak = 0;     // plan none's measured peak allocated
  double none_step_ms = 0;
  // The planner's bases (planner.h), absolute bytes.
  std::int64_t forward_base = 0, block_forward_base = 0, fixed_peak = 0;
  std::vector<std::int64_t> backward_bases;
  std::vector<ProfiledCandidate> candidates;  // [0]: keeping everything (`none`)
  std::int64_t none_loss_peak = 0;            // MemoryCategory::loss's peak in none's step (the logits...)
  ChunkedLossProfile chunked_loss;
  KeepGatheredProfile keep_gathered;
  std::vector<ProfiledSave> saves;            // the traced none step
  double seconds = 0;                         // the profile's wall time
  // The largest (max - min) / max of one candidate's step peak over the
  // rounds: how much the batch moves the peak (MoE routing), 0 for one round.
  double peak_spread = 0;

  // The bytes every plan holds (persistent state and the sharding's working
  // set); an N% budget is this plus N% of none_activation_bytes().
  std::int64_t base_bytes() const { return persistent + sharding_working; }
  std::int64_t none_activation_bytes() const { return none_peak - base_bytes(); }
  // The solver's input for `budget` (absolute peak allocated bytes), with
  // the bases of the unchunked loss or (chunked, when measured) chunked_loss's.
  PlannerInput planner_input(std::int64_t budget, bool allow_lossy, bool chunked = false) const;
};

struct ProfileOptions {
  ModelConfig config;
  std::string dtype = "f32";
  Device device = kCPU;
  // On meta (docs/META.md) the bytes are exact and the step times are the
  // time estimate's on this device model (checkpoint/time_estimate.h).
  std::string device_model = "cpu-measured";
  std::uint64_t seed = 0;
  std::int64_t rounds = 3;        // measured rounds (after one warm-up round)
  bool allow_lossy = false;       // also measure compression candidates
  std::string offload_dir;        // offload's spill file (empty: the temp folder)
  // The Hugging Face folder the run fine-tunes (empty: none): its frozen
  // parameters keep the folder's bf16 / f16 in the profile, as in the run
  // (train/hf_model.h keep_frozen_in_folder_dtypes; no weights are read).
  std::string weights_dir;
  // Components to measure (empty: default_candidates(config, allow_lossy)).
  std::vector<std::string> candidates;
  // Called before each step with a line saying what runs (null: silent).
  std::function<void(const std::string&)> progress;
  // On meta: rank `rank` of this data- and expert-parallel job, simulated
  // (parallel/simulated_group.h): its share of config.batch (the global
  // batch), its experts, its gradient buckets. Pipelines (pp > 1) are not
  // planned (Error).
  std::optional<WorldSpec> world;
  int rank = 0;
  // Under mpirun: the job whose ranks run the profile together, as `train`
  // runs them (null or one rank: one process): each rank its share of the
  // batch, `ep` splitting the experts, ZeRO stage `zero` over the ranks
  // (train/zero.h). Every measurement is the most over the ranks (the
  // slowest rank's time, the fullest rank's bytes), so every rank plans the
  // same. Pipelines are not planned.
  std::shared_ptr<ProcessGroup> job;
  std::int64_t ep = 1, zero = 0;
  // ... with tensor parallelism over `tp` neighbouring ranks of the job
  // (sequence parallel with `sp`; models/tensor_parallel.h), as train --tp:
  // the replays' collectives are part of each measured step.
  std::int64_t tp = 1;
  bool sp = false;
  // The ZeRO stage the step runs under: the simulated world's or `zero`.
  std::int64_t zero_stage() const { return world ? world->zero : zero; }
};

// The components the profile measures by default: the block region, the
// attention / core_attn / mlp module regions, save_matmul, offload, and the
// block, attention and mlp regions with offload (boundaries and what stays
// saved); for MoE models moe_expert, moe_act and moe_expert with offload;
// with allow_lossy compress:fp8, compress:bf16 and the block region with fp8
// boundaries; chunked_loss (measured as the whole plan, not per block:
// PlanProfile::chunked_loss); and under --zero 3 (`zero`) keep_gathered
// (PlanProfile::keep_gathered).
std::vector<std::string> default_candidates(const ModelConfig& config, bool allow_lossy, std::int64_t zero = 0);

// Runs the profile (Error for an unknown component, as --recompute would say).
PlanProfile profile_plans(const ProfileOptions& opts);

// `--memory-budget` text: bytes with an optional unit (B, KB, MB, GB, KiB,
// MiB, GiB; "1.5GiB"), meaning peak allocated on the device, or "N%":
// persistent bytes (PlanProfile::base_bytes) plus N% of plan none's activations. Error naming the
// text and the accepted forms otherwise.
std::int64_t parse_memory_budget(const std::string& text, const PlanProfile& profile);

struct AutoPlan {
  std::int64_t budget = 0;
  // What the solver plans for: the budget less `margin` of it, the larger of
  // 1% (the profile's predictions of a given batch are within about 1% of
  // measured) and the profile's peak_spread (MoE: the batch moves the peak).
  double margin = 0.01;
  std::int64_t planned_budget = 0;
  // .plan: the plan string; .peak: predicted peak allocated. The solver's
  // optimum, or a plan with fewer parts (keep or one component per block)
  // predicted within 2% of its step time.
  PlannerResult best;
  PlannerResult optimum;           // the solver's least predicted time
  double predicted_step_ms = 0;    // none's step + best.time_ms
  // Other plans with their predictions: each candidate on every block, and
  // the solver's answer without offload, that fit the budget, fastest first
  // (at most `max_alternatives`).
  std::vector<PlannerResult> alternatives;
  PlannerResult smallest;          // the least predicted peak
  // Every plan above ends in +chunked_loss when the chunked loss's bases
  // gave the least predicted time (its extra time included).
  bool chunked_loss = false;
};

// The least predicted step time within `budget` less the margin. Throws Error if no
// plan fits, naming the budget, the smallest predicted peak and the plan
// that reaches it.
// `reserve`: bytes planned away on top of the margin; `hooks` false leaves
// offload and compression out (choose_checked_plan).
AutoPlan choose_plan(const PlanProfile& profile, std::int64_t budget, bool allow_lossy, std::size_t max_alternatives = 4,
                     std::int64_t reserve = 0, bool hooks = true);

// The peak allocated bytes of `plan` in a fresh model of opts.config: the
// most of training steps 2 .. steps (step 1 creates the optimizer state), the
// batches the bench worker and the trainer start with.
std::int64_t measure_plan_peak(const ProfileOptions& opts, const std::string& plan, std::int64_t steps = 3);

// choose_plan, then the chosen plan run (measure_plan_peak): if its measured
// peak exceeds the budget less the margin, the choice is made again with the
// overshoot planned away, and if that does not fit either, without offload
// and compression (what offload keeps resident follows its I/O thread's
// timing, which the profile sees only for offload on every block); if no
// such choice is seen to fit, the first choice's two fastest alternatives
// and then its smallest-peak plan are run in turn (those not run yet) and
// the first that fits is taken. The plan returned has been seen to fit unless none of these did
// (then the last choice run, checked = false). Throws as choose_plan when
// the first choice finds no plan.
struct CheckedPlan {
  AutoPlan plan;
  std::int64_t measured_peak = 0;
  bool checked = false;  // measured_peak <= the budget less the margin
  int tries = 0;
  std::vector<std::pair<std::string, std::int64_t>> history;  // each plan run and its measured peak
};
// `measure` stands in for measure_plan_peak(opts, plan) when given (a test
// scripting the runs' peaks).
using PlanPeakMeasure = std::function<std::int64_t(const std::string& plan)>;
CheckedPlan choose_checked_plan(const PlanProfile& profile, const ProfileOptions& opts, std::int64_t budget,
                                bool allow_lossy, const PlanPeakMeasure& measure = nullptr);

// Bytes as "123.4 MiB".
std::string format_mib(std::int64_t bytes);

}  // namespace remat
