// The training loop: model, AdamW, schedule, data, evaluation, and state
// saved to / resumed from safetensors so that a resumed run continues
// bit-identically.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "models/config.h"
#include "models/decoder.h"
#include "parallel/expert_parallel.h"
#include "parallel/grad_reducer.h"
#include "train/data.h"
#include "train/optimizer.h"

namespace remat {

struct TrainOptions {
  ModelConfig config = ModelConfig::named("tiny");
  std::string data_file;        // empty: the generated corpus
  std::int64_t steps = 600;     // total steps of the run (the schedule spans them)
  std::int64_t stop_after = 0;  // stop this invocation after N steps (0: run to `steps`)
  std::uint64_t seed = 0;
  double lr = 3e-3;
  double min_lr = 3e-4;
  std::int64_t warmup = 20;
  double clip = 1.0;            // global gradient-norm clip (0: off)
  double weight_decay = 0.1;
  std::int64_t eval_every = 100; // 0: only at the end
  std::int64_t eval_batches = 8;
  std::string save_dir;         // empty: no saves
  std::int64_t save_every = 0;  // 0: only at the end
  std::string resume_dir;
  std::string recompute = "none";
  std::string dtype = "f32";    // compute dtype: f32, or bf16 (mixed precision: f32 masters and loss)
  Device device = kCPU;         // where parameters, optimizer state and activations live
                                // (a CUDA device becomes the constructing thread's current one)
  // Several processes (under mpirun): the job's ranks share each global
  // batch of config.batch sequences. dp: the data-parallel degree, 0 for the
  // job's size (if set, it must equal it); ep: the expert-parallel degree.
  std::int64_t dp = 0;
  std::int64_t ep = 1;
  std::int64_t bucket_bytes = 25ll << 20;  // data-parallel gradient buckets
  bool reuse_routing_metadata = true;      // replays reuse the forward's exchanged counts
  std::shared_ptr<ProcessGroup> group;     // the ranks of this run (null: world_group())
};

struct StepStats {
  std::int64_t step = 0;        // 1-based: steps completed
  std::int64_t total_steps = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double step_ms = 0;
  double tokens_per_s = 0;
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
  // Several processes: this rank's collectives this step (bytes sent).
  CommCounters comm;
  std::int64_t grad_buckets = 0;          // data-parallel buckets
  std::int64_t grad_buckets_overlapped = 0;  // ... started while backward was still running
  std::optional<double> val_loss;
  // MoE runs: the routing metrics of each MoE layer for this step's batch.
  std::vector<MoELayerStats> routing;
  double aux_loss = 0;  // sum over MoE layers of the load-balancing loss
};

class Trainer {
 public:
  explicit Trainer(TrainOptions opts);

  // Trains from the current step to opts.steps, calling on_step after each
  // step (with val_loss set on evaluation steps). Saves to save_dir every
  // save_every steps and at the end.
  void run(const std::function<void(const StepStats&)>& on_step);
  // Mean loss over eval_batches fixed held-out batches (no grad; does not
  // touch any training RNG).
  double evaluate();

  // Writes DIR/state.safetensors atomically; the state it replaces is kept
  // as DIR/state.prev.safetensors. Several processes: the experts (and their
  // optimizer state) are gathered to rank 0, which writes one file in the
  // layout of one process, so any --ep can resume it. A collective.
  void save(const std::string& dir) const;
  // Loads DIR/state.safetensors, validating everything before changing
  // anything; throws IOError naming the problem (and the previous state, if
  // there is one). Every rank reads the file and takes its own experts.
  void resume(const std::string& dir);

  std::int64_t step() const { return step_; }
  int rank() const { return layout_.world->rank(); }
  int world_size() const { return layout_.world->size(); }
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
  ParallelLayout layout_;
  std::unique_ptr<GradReducer> reducer_;
  double global_mean(double local) const;
};

}  // namespace remat
