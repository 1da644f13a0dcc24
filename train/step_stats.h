// One training step's figures (Trainer::run hands them to its callback)
// and their JSON line (train --log).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "models/moe_layer.h"
#include "parallel/process_group.h"
#include "train/pipeline.h"

namespace remat {

// Which optional groups of keys a step's JSON line carries.
struct StepLogKeys {
  bool pipeline = false;  // pipeline_in_flight, pipeline_stages (a --pp run)
  bool comm = false;      // comm, grad_buckets, grad_buckets_overlapped, routing_metadata_saved_bytes
  bool moe = false;       // loss_aux even without routing metrics (a pipeline's stages keep those)
  bool dynamic = false;   // memory_budget_bytes, budget_headroom_bytes, evictions, rebuilds, ... (--recompute dynamic)
  bool seq = false;       // seq: the batch's sequence length (a --seq-range run)
};

struct StepStats {
  std::int64_t step = 0;        // 1-based: steps completed
  std::int64_t total_steps = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double step_ms = 0;
  double tokens_per_s = 0;      // the batch's real tokens (batch x seq) per second
  std::int64_t seq = 0;         // this step's tokens per sequence (config.seq, or drawn from --seq-range)
  std::int64_t grad_accum = 1;  // micro-batches in this step
  double elapsed_s = 0;
  double eta_s = 0;
  std::int64_t peak_allocated_bytes = 0;  // this step's peak (the device's allocator)
  std::int64_t peak_reserved_bytes = 0;
  std::int64_t persistent_bytes = 0;      // parameters + gradient buffers + optimizer state
  std::int64_t activation_bytes = 0;      // peak_allocated - persistent
  std::int64_t recomputed_ops = 0;        // ops replayed by checkpoint regions
  std::int64_t saved_bytes_peak = 0;      // peak bytes held for backward (saved tensors, boundaries, regenerated)
  std::int64_t boundary_bytes = 0;        // bytes held at region boundaries after the forward
  std::int64_t moved_bytes = 0;           // MoE dispatch/combine bytes in the original forward
  std::int64_t replayed_comm_bytes = 0;   // ... moved again by recompute replays
  std::int64_t routing_metadata_saved_bytes = 0;  // count exchanges replays skipped (reused the forward's)
  // Offload and compression plans (0 without them): bytes written to the
  // spill file this step, the most it held, the time backward waited for
  // reads; bytes of compressed saves packed this step.
  std::int64_t offloaded_bytes = 0;
  std::int64_t offload_stored_peak = 0;
  double offload_wait_ms = 0;
  std::int64_t compressed_saved_bytes = 0;
  // Dynamic rematerialization (--recompute dynamic): its budget, the budget
  // less this step's peak allocated, saves evicted (and their bytes), op
  // calls computed again and the time they took.
  std::int64_t memory_budget_bytes = 0;
  std::int64_t evictions = 0, evicted_bytes = 0, rebuilds = 0;
  double rebuild_ms = 0;
  // Several processes: this rank's collectives this step (bytes sent).
  CommCounters comm;
  std::int64_t pipeline_in_flight = 0;    // --pp: micro-batches this stage held activations for at once
  std::vector<PipelineStageStats> pipeline_stages;  // --pp: every stage's figures for this step
  std::int64_t grad_buckets = 0;          // data-parallel buckets
  std::int64_t grad_buckets_overlapped = 0;  // ... started while backward was still running
  std::optional<double> val_loss;
  // MoE runs: the routing metrics of each MoE layer for this step's batch.
  std::vector<MoELayerStats> routing;
  double aux_loss = 0;  // sum over MoE layers of the load-balancing loss
  // Non-finite values and loss scaling. A skipped step's `step` is the one
  // attempted (it is tried again next, with the next batch), its grad_norm
  // is NaN when backward did not run (a non-finite loss).
  bool skipped = false;              // this step's update was dropped
  bool overflow = false;             // ... because f16 gradients overflowed (the scale halved)
  std::int64_t skipped_steps = 0;    // non-finite steps skipped so far in this run() (--on-nonfinite skip)
  std::int64_t overflow_steps = 0;   // f16 overflow steps skipped so far in this run()
  double loss_scale = 1;             // the scale this step's backward used (f16; 1 otherwise)

  // The step as one JSON object on one line (the keys of train --log,
  // docs/REFERENCE.md), with the optional groups `keys` selects.
  std::string to_json(const StepLogKeys& keys) const;
};

}  // namespace remat
