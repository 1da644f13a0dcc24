// The training loop: model, AdamW, schedule, data, evaluation, and state
// saved to / resumed from safetensors so that a resumed run continues
// bit-identically.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/error.h"
#include "models/config.h"
#include "models/decoder.h"
#include "parallel/grad_reducer.h"
#include "train/data.h"
#include "train/optimizer.h"
#include "train/parallel_layout.h"
#include "train/pipeline.h"

namespace remat {

struct TrainOptions {
  ModelConfig config = ModelConfig::named("tiny");
  std::string data_file;        // empty: the generated corpus; token shards (a *.tok file or a folder of them) or text
  std::string tokenizer;        // the tokenizer the shards were made with (recorded in saves, for generate)
  // A Hugging Face model folder (train/hf_model.h) whose weights replace the
  // seeded initialisation; `config` must be its config (load_hf_config). The
  // optimizer starts fresh. Ignored when resuming (the state has the weights).
  std::string init_model;
  std::int64_t steps = 600;     // total steps of the run (the schedule spans them)
  std::int64_t stop_after = 0;  // stop this invocation after N steps (0: run to `steps`)
  std::uint64_t seed = 0;
  double lr = 3e-3;
  double min_lr = 3e-4;
  std::int64_t warmup = 20;
  // The learning-rate schedule after the warm-up: "cosine" (to min_lr at
  // `steps`), "linear" (the same, a straight line) or "constant" (lr).
  std::string schedule = "cosine";
  // Micro-batches per optimizer step: each rank's share of config.batch
  // sequences runs as grad_accum micro-batches, each forward followed by its
  // backward (activations of one micro-batch at a time), gradients summed
  // (each micro-batch's loss weighted 1/grad_accum, so the gradient is the
  // whole batch's up to summation order). config.batch must divide by ranks x
  // grad_accum.
  std::int64_t grad_accum = 1;
  double clip = 1.0;            // global gradient-norm clip (0: off)
  double weight_decay = 0.1;
  std::int64_t eval_every = 100; // 0: only at the end
  std::int64_t eval_batches = 8;
  std::string save_dir;         // empty: no saves
  std::int64_t save_every = 0;  // 0: only at the end
  std::string resume_dir;
  std::string recompute = "none";
  std::string offload_dir;      // the offload plans' spill file (empty: the temp folder)
  std::string dtype = "f32";    // compute dtype: f32, or bf16 (mixed precision: f32 masters and loss)
  Device device = kCPU;         // where parameters, optimizer state and activations live
                                // (a CUDA device becomes the constructing thread's current one)
  // Several processes (under mpirun): the job's ranks share each global
  // batch of config.batch sequences. dp: the data-parallel degree, 0 for the
  // job's size (if set, it must equal it; with pp, the job's size / pp); ep:
  // the expert-parallel degree.
  std::int64_t dp = 0;
  std::int64_t ep = 1;
  std::int64_t bucket_bytes = 25ll << 20;  // data-parallel gradient buckets
  // Pipeline parallel (train/pipeline.h): pp stages over a job of pp x D
  // ranks (stage-major: rank s * D + d runs stage s of replica d; dp, if
  // set, must be D), each stage's D replicas sharing the batch (and, with ep,
  // splitting the experts) as data parallel does. Micro-batches from
  // grad_accum, in the order of pp_schedule ("1f1b" or "gpipe"). pp_split:
  // the first block of each stage after the first (empty: balanced by
  // parameter count). Dropout and random routes draw from keyed streams
  // (engine/rng.h), the same under any schedule. Not yet with tied
  // embeddings or CUDA. Saves gather every stage's tensors to rank 0
  // (one process's layout: any layout resumes them); every stage resumes its
  // own from the file.
  std::int64_t pp = 1;
  std::string pp_schedule = "1f1b";
  std::string pp_split;
  bool reuse_routing_metadata = true;      // replays reuse the forward's exchanged counts
  std::shared_ptr<ProcessGroup> group;     // the ranks of this run (null: world_group())

  // Non-finite values: a step whose loss or gradient norm is inf or NaN.
  // "stop" throws NonFiniteError naming the step and the value, before any
  // update and without saving (the state on disk stays the last good one).
  // "skip" drops that step's update (no optimizer step: parameters and
  // optimizer state untouched) and tries the step again on the next batch
  // (the data sampler and dropout stream advance, the step counter and the
  // schedule do not); max_nonfinite_skips skipped steps in a row stop the
  // run as "stop" would.
  std::string on_nonfinite = "stop";
  std::int64_t max_nonfinite_skips = 10;
  // f16 compute only: dynamic loss scaling. Backward is seeded with the
  // scale (the loss times the scale), the gradients are divided by it before
  // the norm and clipping; a step whose scaled gradients overflow (inf/NaN)
  // is skipped like a non-finite one (not counted as one) and the scale
  // halves; after loss_scale_growth_interval good steps in a row it doubles.
  // A scale that would fall below loss_scale_min throws NonFiniteError.
  // bf16 and f32 do not scale. Powers of two keep the unscaling exact.
  double loss_scale_init = 65536;
  std::int64_t loss_scale_growth_interval = 2000;
  double loss_scale_min = 1;

  // Fault injection for tests, called on every rank with the 1-based step
  // being attempted: `fault_loss` may change this rank's loss before it is
  // averaged over the ranks (e.g. to NaN); `fault_seed` may change the
  // factor this rank's backward is seeded with (1/ranks times the loss
  // scale), e.g. to inf, or to a huge value to overflow f16 gradients.
  std::function<void(std::int64_t step, double& local_loss)> fault_loss;
  std::function<void(std::int64_t step, double& seed)> fault_seed;
};

// A step's loss or gradient norm was not finite (or the f16 loss scale
// collapsed) and the run stopped. Nothing was saved after the last good step.
class NonFiniteError : public Error {
 public:
  NonFiniteError(const std::string& message, std::int64_t step, double value)
      : Error(message), step_(step), value_(value) {}
  std::int64_t step() const { return step_; }  // the 1-based step that failed
  double value() const { return value_; }      // the offending loss, gradient norm or scale

 private:
  std::int64_t step_;
  double value_;
};

struct StepStats {
  std::int64_t step = 0;        // 1-based: steps completed
  std::int64_t total_steps = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double step_ms = 0;
  double tokens_per_s = 0;
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
};

// The model of the training state in DIR (state.safetensors, or the previous
// state as --resume would choose): built from the state's config and loaded
// with its parameters, every checksum verified (IOError naming the problem).
// `metadata`, if given, receives the state's metadata (step, config, data,
// tokenizer, ...).
std::unique_ptr<DecoderModel> load_trained_model(const std::string& dir,
                                                 std::map<std::string, std::string>* metadata = nullptr);

class Trainer {
 public:
  // Validates the options first (Error naming the option, its value and
  // the accepted range), then builds the model, optimizer and data, and
  // resumes from resume_dir if set.
  explicit Trainer(TrainOptions opts);

  // Trains from the current step to opts.steps, calling on_step after each
  // step (with val_loss set on evaluation steps; also after a skipped step).
  // Saves to save_dir every save_every steps and at the end. A non-finite
  // loss or gradient norm throws NonFiniteError (see on_nonfinite) before
  // any update or save, so the state on disk stays the last good one.
  void run(const std::function<void(const StepStats&)>& on_step);
  // Mean loss over eval_batches fixed held-out batches (no grad; does not
  // touch any training RNG).
  double evaluate();

  // Writes DIR/state.safetensors with every tensor checksummed, crash-safely
  // (train/state_files.h: there is always a complete state on disk); the
  // state it replaces is kept as DIR/state.prev.safetensors. Several
  // processes: the experts (and their optimizer state) are gathered to rank
  // 0, which writes one file in the layout of one process, so any --ep can
  // resume it. A collective.
  void save(const std::string& dir) const;
  // The parameters in the layout of one process (under expert parallelism
  // every rank gathers every expert), as save() writes them. A collective.
  std::vector<std::pair<std::string, Tensor>> one_process_parameters() const;
  // Loads DIR/state.safetensors (or, when a save left none,
  // DIR/state.prev.safetensors), verifying every checksum and validating
  // everything before changing anything; throws IOError naming the problem
  // (a checksum mismatch names the tensor and the file) and what the
  // previous state offers. States without checksums load, with a note.
  // Every rank reads the file and takes its own experts.
  void resume(const std::string& dir);
  // Notes for the user from the last successful resume (the library does not
  // print): a state without checksums, a fall-back to the previous state,
  // leftover temporary files ignored.
  const std::vector<std::string>& resume_notes() const { return resume_notes_; }

  std::int64_t step() const { return step_; }
  // The f16 loss scale and the good steps since it last changed (1 and 0
  // when not scaling); part of the state a bit-identical resume needs.
  double loss_scale() const { return loss_scale_; }
  std::int64_t loss_scale_good_steps() const { return good_steps_; }
  void set_loss_scale(double scale, std::int64_t good_steps);
  // This process's rank in the job (rank 0 prints and saves); world_size():
  // the ranks that share each batch (data / expert parallel; under a
  // pipeline, the replicas of this rank's stage: the stages share a batch by
  // running its micro-batches in turn).
  int rank() const { return job_->rank(); }
  int world_size() const { return layout_.world->size(); }
  // The pipeline stage of this rank (null without --pp).
  const PipelineStage* pipeline() const { return pipeline_.get(); }
  const ParallelLayout& layout() const { return layout_; }
  const Corpus& corpus() const { return corpus_; }
  DecoderModel& model() { return *model_; }
  const TrainOptions& options() const { return opts_; }
  double initial_loss_estimate() const;

 private:
  TrainOptions opts_;
  Corpus corpus_;
  std::unique_ptr<DecoderModel> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<BatchSampler> sampler_;
  std::int64_t step_ = 0;
  std::vector<std::string> resume_notes_;
  bool scaling_ = false;      // f16: dynamic loss scaling
  double loss_scale_ = 1;
  std::int64_t good_steps_ = 0;
  ParallelLayout layout_;
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<PipelineStage> pipeline_;
  std::shared_ptr<ProcessGroup> pipeline_group_;
  std::shared_ptr<ProcessGroup> job_;  // every rank of the job (pp x dp)
  double global_mean(double local) const;
  // `tensors` with every rank's routed experts gathered (one process's layout).
  std::vector<std::pair<std::string, Tensor>> gather_experts(std::vector<std::pair<std::string, Tensor>> tensors) const;
};

}  // namespace remat
