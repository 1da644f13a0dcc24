// The training loop: model, AdamW, schedule, data, evaluation, and state
// saved to / resumed from safetensors so that a resumed run continues
// bit-identically (train/trainer.cc builds and runs; train/trainer_state.cc
// saves and resumes).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/plan.h"
#include "engine/error.h"
#include "models/config.h"
#include "models/decoder.h"
#include "parallel/grad_reducer.h"
#include "train/data.h"
#include "train/hf_model.h"
#include "train/loss_scaler.h"
#include "train/nonfinite.h"
#include "train/parallel_layout.h"
#include "train/pipeline.h"
#include "train/step_stats.h"
#include "train/train_options.h"
#include "train/zero.h"
#include "models/tensor_parallel.h"

namespace remat {

// The model of the training state in DIR (state.safetensors, or the previous
// state as --resume would choose): built from the state's config and loaded
// with its parameters, every checksum verified (IOError naming the problem).
// `metadata`, if given, receives the state's metadata (step, config, data,
// tokenizer, ...).
std::unique_ptr<DecoderModel> load_trained_model(const std::string& dir,
                                                 std::map<std::string, std::string>* metadata = nullptr);

// Writes the model of the training state in DIR (chosen as above) to the
// Hugging Face folder `out` (save_hf_model), reading one parameter at a
// time from the state's files (a sharded set's rank files included): memory
// holds one tensor, never the model, and only what is read is verified.
// An empty options.tokenizer copies the tokenizer the state was trained
// with, if any. A LoRA state (config.lora) needs options.merge_adapter: its
// adapters are merged into the weights (merge_lora, train/adapter_files.h)
// and the folder is the model without them (Error otherwise, and for
// merge_adapter on a state without adapters). Returns the state's metadata
// and sets *parameters to the exported model's count. IOError as
// load_trained_model.
std::map<std::string, std::string> export_trained_state(const std::string& dir, const std::string& out,
                                                        const HfExportOptions& options, std::int64_t* parameters);

// Writes the LoRA adapters of the training state in DIR (chosen as above)
// as a PEFT adapter folder `out` (train/adapter_files.h save_adapter, in
// `dtype`, base_model_name_or_path `base_model`), reading the adapter
// tensors only. Error when the state has none; IOError as
// load_trained_model. Returns the state's metadata.
std::map<std::string, std::string> export_trained_adapter(const std::string& dir, const std::string& out,
                                                          const std::string& base_model, DType dtype);

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
  // Runs the next step as run() does (evaluating and saving on its
  // eval_every / save_every steps and the last) and returns its figures:
  // for a program's own loop. Ignores stop_after; Error after the last step.
  StepStats train_step();
  ~Trainer();
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
  double loss_scale() const { return scaler_.scale(); }
  std::int64_t loss_scale_good_steps() const { return scaler_.good_steps(); }
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
  // The tensor-parallel group of --tp (null without).
  const std::shared_ptr<const TensorParallel>& tensor_parallel() const { return tp_; }
  // The model's parameter count in one process's layout (--tp slices counted whole).
  std::int64_t model_parameters() const;
  const Corpus& corpus() const { return corpus_; }
  DecoderModel& model() { return *model_; }
  const DecoderModel& model() const { return *model_; }
  const TrainOptions& options() const { return opts_; }
  double initial_loss_estimate() const;

 private:
  // Per run(): its steps, its clock and its non-finite decisions.
  struct RunState;
  // Per step: the batch and the counters its figures are differences of.
  struct StepStart;
  // Per step: the loss of the micro-batches (and the pipeline's timings).
  struct StepLoss;

  // ---- building (the constructor's steps)
  JobGroups split_job();  // --tp innermost, then --pp: stage-major pipelines and replicas (Error for a layout that cannot run)
  void build_model(const RecomputePlan& plan, const ProcessGroup& world);  // seeded or --model weights, on the device
  void build_shapes_only();  // --zero 3: on meta; initial_ says where the shards' values come from
  void slice_initial_values();  // --zero 3 under --tp: this rank's slices, initial_ reading their ranges
  void build_tp_slices_from_model();  // --tp with --model DIR: this rank's slices read from the folder
  void build_pipeline(std::shared_ptr<ProcessGroup> pipeline_group);  // this rank's stage (split or balanced)
  void build_optimizer();  // gradient reducer, AdamW over this rank's parameters, the batch sampler

  // ---- one step of run()
  StepStats one_step(RunState& run);  // a step of run(), or of train_step()
  StepStart begin_step();  // resets the peaks, draws the batch, zeroes gradients, snapshots the counters
  // Every micro-batch's forward and backward (one path for both layouts):
  // the step's loss; s gets aux_loss, routing, boundary bytes, pipeline_in_flight.
  StepLoss micro_steps(const Tensor& batch, std::int64_t attempt, StepStats& s);
  double local_micro_steps(const Tensor& batch, std::int64_t attempt, StepStats& s);  // this process's blocks
  double pipeline_micro_steps(const Tensor& batch, std::int64_t attempt, StepStats& s,
                              PipelineStage::StepResult& timing);  // the stage's schedule
  // Adds a micro-batch's loss (mean over ranks) to the step's; false when it is not finite.
  bool add_micro_loss(std::int64_t attempt, std::int64_t micro, double local, double aux, double& loss,
                      StepStats& s) const;
  double backward_seed(std::int64_t attempt) const;  // 1/(ranks x micro-batches) of the loss scale
  // The non-finite policy, the loss scaler, clipping and AdamW: step_ advances unless s.skipped.
  void apply_update(double loss, double lr, std::int64_t attempt, RunState& run, StepStats& s);
  double grad_norm() const;  // the global gradient norm, the same bits on every rank
  void collect_counters(const StepStart& start, StepStats& s) const;  // offload, compression, recompute, MoE bytes
  void collect_stats(const StepStart& start, const RunState& run, double lr, const StepLoss& loss, StepStats& s);
  void evaluate_and_save(std::int64_t stop, StepStats& s);  // on eval_every / save_every steps and the last
  std::string stop_note() const;  // what a stopped run says about the state on disk

  // The tensors whose gradients the update reads (with --zero: this rank's
  // shard pieces, bound to this step's gradients, and the unsharded
  // parameters), every parameter whose gradient it needs given one (zeros
  // where backward did not reach it).
  std::vector<Tensor> update_tensors();
  // The optimizer state to save, in one process's layout (a collective under --zero).
  // parameter_values(): owned_parameters() with values (--zero 3: gathered, a collective).
  std::vector<std::pair<std::string, Tensor>> parameter_values() const;
  std::vector<std::pair<std::string, Tensor>> optimizer_state() const;
  ShardedGradReducer* sharded_reducer() const { return zero_ ? zero_->grad_reducer() : nullptr; }
  // This rank's parameters (a pipeline stage's own), in the model's order.
  std::vector<std::pair<std::string, Tensor>> owned_parameters() const;
  // owned_parameters() that require grad: what the optimizer, the gradient
  // reduction and the gradient norm see (frozen ones have no gradient).
  std::vector<std::pair<std::string, Tensor>> trainable_parameters() const;
  double global_mean(double local) const;
  // `tensors` with every rank's routed experts gathered (one process's layout).
  std::vector<std::pair<std::string, Tensor>> gather_experts(std::vector<std::pair<std::string, Tensor>> tensors) const;

  TrainOptions opts_;
  Corpus corpus_;
  std::unique_ptr<DecoderModel> model_;
  ParameterRangeSource initial_;  // --zero 3: the shards' values, until the optimizer has made them
  std::unique_ptr<AdamW> optimizer_;       // without --zero
  std::unique_ptr<ZeroOptimizer> zero_;    // --zero 1|2 (then no optimizer_)
  std::unique_ptr<BatchSampler> sampler_;
  std::int64_t step_ = 0;
  std::unique_ptr<RunState> stepping_;  // train_step()'s run (made by its first call)
  std::vector<std::string> resume_notes_;
  LossScaler scaler_;  // f16: dynamic loss scaling
  ParallelLayout layout_;
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<PipelineStage> pipeline_;
  std::shared_ptr<ProcessGroup> pipeline_group_;
  std::shared_ptr<ProcessGroup> job_;  // every rank of the job (tp x pp x dp)
  std::shared_ptr<const TensorParallel> tp_;  // --tp: this rank's tensor-parallel group (null without)
  CommCounters comm_counters() const;  // every group's counters: the layout's and the tensor-parallel ones
  // `tensors` (parameters or their AdamW moments, "optimizer.exp_avg.<name>")
  // with every tensor-parallel slice made whole (a collective over tp_).
  std::vector<std::pair<std::string, Tensor>> gather_tensor_parallel(
      std::vector<std::pair<std::string, Tensor>> tensors) const;
};

}  // namespace remat
