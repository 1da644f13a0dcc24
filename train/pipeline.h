// Pipeline parallelism (docs/PARALLEL.md#pipeline-parallel): the decoder's
// blocks split into P contiguous stages, one per rank, micro-batches flowing
// forward (hidden states) and backward (their gradients) between neighbouring
// stages by point-to-point messages, in the order a schedule gives each stage.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/decoder.h"
#include "parallel/process_group.h"

namespace remat {

enum class PipelineSchedule {
  gpipe,  // every micro-batch's forward, then every backward
  one_f_one_b,  // P - s - 1 forwards, then one forward and one backward in turn, then the remaining backwards
};
// "gpipe" or "1f1b"; Error naming the valid values otherwise.
PipelineSchedule parse_pipeline_schedule(const std::string& name);
const char* pipeline_schedule_name(PipelineSchedule s);

// One step of a stage's schedule: the forward or the backward of micro-batch `micro`.
struct PipelineOp {
  bool forward = true;
  std::int64_t micro = 0;
  bool operator==(const PipelineOp& o) const { return forward == o.forward && micro == o.micro; }
};

// Stage `stage` of `stages`' order of forwards and backwards over
// `micro_batches`. Backwards always run in micro-batch order 0, 1, ..., so a
// parameter's gradient sums the micro-batches in the order one process
// accumulating them would (the same bits). Error for stage outside
// [0, stages) or micro_batches < 1.
std::vector<PipelineOp> pipeline_ops(PipelineSchedule schedule, std::int64_t stages, std::int64_t stage,
                                     std::int64_t micro_batches);

// The most micro-batches a stage holds activations for at once under its
// schedule (forwarded, backward not yet run): M for gpipe, min(M, P - s) for 1f1b.
std::int64_t max_in_flight(const std::vector<PipelineOp>& ops);

// Stage boundaries for `block_params[i]` parameters in block i, the first
// stage also holding `first_extra` (the embedding) and the last `last_extra`
// (final norm and head): P + 1 block indices 0 = b_0 < b_1 < ... < b_P =
// blocks, stage s holding blocks [b_s, b_{s+1}), chosen to minimise the
// largest stage's parameter count (ties: earlier boundaries). Error when
// there are fewer blocks than stages.
std::vector<std::int64_t> balanced_stages(const std::vector<std::int64_t>& block_params, std::int64_t first_extra,
                                          std::int64_t last_extra, std::int64_t stages);

// balanced_stages of `model`'s blocks (by parameter count), the embedding
// on the first stage, the final norm and the LM head on the last.
std::vector<std::int64_t> balanced_stages(const DecoderModel& model, std::int64_t stages);

// --pp-split "3,6": the P - 1 inner boundaries, increasing, each in
// (0, blocks); returns all P + 1. Error naming the value otherwise.
std::vector<std::int64_t> parse_pp_split(const std::string& text, std::int64_t blocks, std::int64_t stages);

// One stage's figures for one step (train --log "pipeline_stages").
struct PipelineStageStats {
  std::int64_t stage = 0, first_block = 0, end_block = 0;
  std::int64_t peak_allocated_bytes = 0, activation_bytes = 0;
  std::int64_t in_flight = 0;                // micro-batches held at once
  double forward_ms = 0, backward_ms = 0;    // computing
  double idle_ms = 0;                        // waiting for a neighbour (receives, the last sends)
  std::int64_t sent_bytes = 0;
  // idle / (forward + backward + idle): the bubble; (P - 1) / (M + P - 1)
  // for equal stages and free messages.
  double bubble() const {
    const double all = forward_ms + backward_ms + idle_ms;
    return all > 0 ? idle_ms / all : 0.0;
  }
};

// One rank's stage of a pipeline over `group` (rank s = stage s): the
// embedding on stage 0, blocks [bounds[s], bounds[s + 1]) of `model` (every
// rank builds the whole model from the same seed; a stage computes and
// updates only what it owns, and releases the elements of every other
// parameter when built: Tensor::release_storage), the final norm, head and
// loss on the last.
// Hidden states go to the next stage with tag 2m (micro-batch m), their
// gradients back with tag 2m + 1, sends non-blocking, receives blocking.
class PipelineStage {
 public:
  PipelineStage(DecoderModel& model, std::shared_ptr<ProcessGroup> group, std::vector<std::int64_t> bounds,
                PipelineSchedule schedule);
  std::int64_t stage() const { return stage_; }
  std::int64_t stages() const { return std::int64_t(bounds_.size()) - 1; }
  const std::vector<std::int64_t>& bounds() const { return bounds_; }
  PipelineSchedule schedule() const { return schedule_; }
  // True for the parameters this stage holds (by name).
  bool owns(const std::string& parameter_name) const { return owner(parameter_name) == stage_; }
  // The stage that holds a parameter (Error for a name no stage holds).
  std::int64_t owner(const std::string& parameter_name) const;
  // `mine` (this stage's f32 tensors: parameters, optimizer state, any
  // names) with every other stage's appended on rank 0, in stage order, so
  // rank 0 holds one process's tensors; other ranks get `mine` back. A
  // collective (names and shapes travel with the tensors).
  std::vector<std::pair<std::string, Tensor>> gather_to_first(std::vector<std::pair<std::string, Tensor>> mine);
  // This stage's parameters in the model's order (listed once, when built).
  std::vector<std::pair<std::string, Tensor>> parameters() const;

  struct StepResult {
    std::vector<double> loss, aux;  // per micro-batch, on every rank (combine_loss's values)
    std::int64_t peak_in_flight = 0;  // micro-batches whose activations this stage held at once
    double forward_ms = 0, backward_ms = 0, idle_ms = 0;
    std::int64_t sent_bytes = 0;
  };
  // One optimizer step's forwards and backwards over `batch` [B, S + 1] cut
  // into `micro_batches` micro-batches of consecutive rows, each backward
  // seeded with `seed` (1 / M times the loss scale, as one process). Every
  // rank returns every micro-batch's loss and aux (gathered from the stages),
  // the same bits as one process's forward_loss. Block b of micro-batch m
  // draws from random stream (m, b) of the default generator (engine/rng.h),
  // which then continues past M micro-batches of streams, as one process's
  // trainer. `before_last_backward` runs just before the stage's last
  // backward (a data-parallel reducer arms there). A collective over the group.
  StepResult step(const Tensor& batch, std::int64_t micro_batches, double seed,
                  const std::function<void()>& before_last_backward = {});
  // This stage's figures from its step's result (the memory figures left 0).
  PipelineStageStats stage_stats(const StepResult& r) const;
  // Every stage's figures (this one's `mine`), in stage order, on every rank. A collective.
  std::vector<PipelineStageStats> gather_stats(const PipelineStageStats& mine);
  // Cross-entropy of `batch` as one micro-batch, forward only (no grad), on every rank.
  double eval_ce(const Tensor& batch);
  // Every stage's `partials` (this stage's grad_sq_partials of some of its
  // parameters, in parameter order) added in stage order from 0: for the
  // same parameters of one process, its grad_sq_sum bit for bit. A collective.
  double sum_over_stages(const std::vector<double>& partials);

 private:
  struct Pass;  // one forward_backward call's state (train/pipeline.cc)
  std::vector<double> forward_backward(const Tensor& batch, std::int64_t micro_batches, double seed, bool train,
                                       StepResult* timing, const std::function<void()>& before_last_backward);
  DecoderModel& model_;
  std::shared_ptr<ProcessGroup> group_;
  std::vector<std::int64_t> bounds_;
  PipelineSchedule schedule_;
  std::int64_t stage_ = 0;
  std::vector<std::int64_t> moe_layers_;  // MoE blocks per stage
  std::vector<std::pair<std::string, Tensor>> owned_;  // this stage's parameters, in the model's order
};

}  // namespace remat
