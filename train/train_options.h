// The options of a training run (Trainer): the model, data, schedule,
// parallel layout, precision and the non-finite policy. Options that are
// names on the command line are enums here, parsed once at the edge
// (parse_lr_schedule, compute_dtype_from_name, parse_pipeline_schedule,
// parse_nonfinite_action).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "engine/device.h"
#include "engine/dtype.h"
#include "models/config.h"
#include "parallel/process_group.h"
#include "train/data.h"
#include "train/nonfinite.h"
#include "train/optimizer.h"
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
  // A PEFT adapter folder (train/adapter_files.h) loaded over init_model's
  // weights: config.lora must be its config (read_adapter_config). Needs
  // init_model; ignored when resuming, as init_model is.
  std::string adapter;
  std::int64_t steps = 600;     // total steps of the run (the schedule spans them)
  std::int64_t stop_after = 0;  // stop this invocation after N steps (0: run to `steps`)
  std::uint64_t seed = 0;
  double lr = 3e-3;
  double min_lr = 3e-4;
  std::int64_t warmup = 20;
  // The learning-rate schedule after the warm-up: cosine (to min_lr at
  // `steps`), linear (the same, a straight line) or constant (lr).
  LrSchedule schedule = LrSchedule::cosine;
  // Micro-batches per optimizer step: each rank's share of config.batch
  // sequences runs as grad_accum micro-batches, each forward followed by its
  // backward (activations of one micro-batch at a time), gradients summed
  // (each micro-batch's loss weighted 1/grad_accum, so the gradient is the
  // whole batch's up to summation order). config.batch must divide by ranks x
  // grad_accum.
  std::int64_t grad_accum = 1;
  // Variable-length batches (--seq-range MIN:MAX): every step's batch draws
  // its own sequence length S uniformly from [min, max] (train/data.h), and
  // its tokens, its micro-batches and its figures are of that S. config.seq
  // must be max (the model is built for the longest); evaluation stays at
  // config.seq. Not with sp (each length would have to divide by tp).
  // Unset: every batch has config.seq tokens per sequence.
  std::optional<SeqRange> seq_range;
  double clip = 1.0;            // global gradient-norm clip (0: off)
  double weight_decay = 0.1;
  std::int64_t eval_every = 100; // 0: only at the end
  std::int64_t eval_batches = 8;
  std::string save_dir;         // empty: no saves
  std::int64_t save_every = 0;  // 0: only at the end
  std::string resume_dir;
  std::string recompute = "none";
  std::string offload_dir;      // the offload plans' spill file (empty: the temp folder)
  // Compute dtype: f32, bf16 (mixed precision: f32 masters and loss) or f16
  // (the same, with loss scaling); compute_dtype_from_name parses --dtype.
  DType dtype = DType::f32;
  Device device = kCPU;         // where parameters, optimizer state and activations live
                                // (a CUDA device becomes the constructing thread's current one)
  // Several processes (under mpirun): the job's ranks share each global
  // batch of config.batch sequences. dp: the data-parallel degree, 0 for the
  // job's size (if set, it must equal it; with pp, the job's size / pp); ep:
  // the expert-parallel degree.
  std::int64_t dp = 0;
  std::int64_t ep = 1;
  std::int64_t bucket_bytes = 25ll << 20;  // data-parallel gradient buckets
  // Sharded data parallel over the data-parallel ranks (train/zero.h): 0
  // none, 1 the optimizer state and the update, 2 also the gradients, 3
  // also the parameters (gathered one unit at a time). Needs 2 or more
  // data-parallel ranks (each stage's replicas under pp); 3 not yet with
  // tied embeddings.
  std::int64_t zero = 0;
  // Pipeline parallel (train/pipeline.h): pp stages over a job of pp x D
  // ranks (stage-major: rank s * D + d runs stage s of replica d; dp, if
  // set, must be D), each stage's D replicas sharing the batch (and, with ep,
  // splitting the experts) as data parallel does. Micro-batches from
  // grad_accum, in the order of pp_schedule (1f1b or gpipe). pp_split:
  // the first block of each stage after the first (empty: balanced by
  // parameter count). Dropout and random routes draw from keyed streams
  // (engine/rng.h), the same under any schedule. Not yet with tied
  // embeddings or CUDA. Saves gather every stage's tensors to rank 0
  // (one process's layout: any layout resumes them); every stage resumes its
  // own from the file.
  std::int64_t pp = 1;
  // Tensor parallel (models/tensor_parallel.h): tp ranks split every block's
  // matmuls, the embedding and the LM head; they are the innermost
  // (neighbouring) ranks of the job, which holds tp x dp (x pp) of them.
  // sp: sequence parallel, the tensors between the blocks' regions sharded
  // along the sequence over the tp ranks. Not yet on a CUDA device.
  std::int64_t tp = 1;
  bool sp = false;
  PipelineSchedule pp_schedule = PipelineSchedule::one_f_one_b;
  std::string pp_split;
  bool reuse_routing_metadata = true;      // replays reuse the forward's exchanged counts
  std::shared_ptr<ProcessGroup> group;     // the ranks of this run (null: world_group())

  // Non-finite values: a step whose loss or gradient norm is inf or NaN.
  // stop throws NonFiniteError naming the step and the value, before any
  // update and without saving (the state on disk stays the last good one).
  // skip drops that step's update (no optimizer step: parameters and
  // optimizer state untouched) and tries the step again on the next batch
  // (the data sampler and dropout stream advance, the step counter and the
  // schedule do not); max_nonfinite_skips skipped steps in a row stop the
  // run as stop would.
  NonFiniteAction on_nonfinite = NonFiniteAction::stop;
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

// Every option a library user can set wrong, checked before anything is
// built: Error naming the option (and its flag), the value and the range.
void validate_train_options(const TrainOptions& o);

}  // namespace remat
