#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "checkpoint/checkpoint.h"
#include "engine/autograd.h"
#include "engine/device_runtime.h"
#include "engine/rng.h"
#include "models/recompute.h"
#include "moe/dispatch.h"
#include "train/adapter_files.h"
#include "train/hf_model.h"

namespace remat {

namespace {
// The sum over the group's ranks of one double per rank, added in rank order
// (the same bits on every rank).
double sum_in_rank_order(ProcessGroup& g, double v) {
  if (g.size() == 1) return v;
  std::int64_t bits = 0;
  std::memcpy(&bits, &v, sizeof v);
  const auto all = g.all_gather(from_vector<std::int64_t>({bits}, {1})).to_vector<std::int64_t>();
  double total = 0;
  for (std::int64_t b : all) {
    double x = 0;
    std::memcpy(&x, &b, sizeof x);
    total += x;
  }
  return total;
}
}  // namespace

// ---- building ---------------------------------------------------------------

namespace {
// f16 computes with dynamic loss scaling; bf16 and f32 do not scale.
LossScaler loss_scaler_for(const TrainOptions& o) {
  LossScaler::Options so;
  so.init = o.loss_scale_init;
  so.growth_interval = o.loss_scale_growth_interval;
  so.min = o.loss_scale_min;
  return LossScaler(o.dtype == DType::f16, so);
}

// --seq-range with chunked_loss:N: the shortest batch's micro-batch (`rows`
// sequences of MIN tokens) must still hold one chunk (Error naming both).
void check_chunks_fit_range(const TrainOptions& o, const RecomputePlan& plan, std::int64_t rows) {
  if (!o.seq_range || !plan.chunked_loss || plan.loss_chunk <= 0) return;
  const std::int64_t shortest = rows * o.seq_range->min;
  REMAT_CHECK(plan.loss_chunk <= shortest, Error, "--recompute ", plan.spec, " with --seq-range ", o.seq_range->min,
              ":", o.seq_range->max, ": chunks of ", plan.loss_chunk, " tokens, but a micro-batch of the shortest "
              "length holds ", shortest, " (", rows, " sequences x ", o.seq_range->min, "); use chunks of at most ",
              shortest, " or a larger MIN");
}
}  // namespace

Trainer::Trainer(TrainOptions opts) : opts_(std::move(opts)), scaler_(loss_scaler_for(opts_)) {
  validate_train_options(opts_);
  opts_.config.validate();
  const auto& c = opts_.config;
  RecomputePlan plan = RecomputePlan::parse(opts_.recompute, c.n_layers);
  plan.offload_dir = opts_.offload_dir;
  check_tensor_parallel(c, opts_.tp, opts_.sp);
  REMAT_CHECK(opts_.tp == 1 || opts_.device.is_cpu(), Error, "--tp ", opts_.tp, " with --device ",
              opts_.device.str(), ": not supported yet (tensor parallelism runs on the CPU under MPI, with --dp, --ep, "
              "--pp and --zero)");
  REMAT_CHECK(opts_.zero != 3 || !c.tie_embeddings, Error, "--zero 3: config ", c.name, " ties its embeddings (the "
              "LM head uses the embedding's weight), which sharded parameters do not support yet; use --zero 2");
  const bool fine_tuning = c.lora.enabled() || !c.freeze.empty();
  REMAT_CHECK(!fine_tuning || (opts_.zero == 0 && opts_.tp == 1), Error, "--lora / --freeze with ",
              opts_.zero ? "--zero " + std::to_string(opts_.zero) : "--tp " + std::to_string(opts_.tp),
              ": not supported yet (frozen parameters and adapters train with --dp, --ep and --pp; ZeRO's shards and "
              "tensor-parallel slices assume every parameter trains)");
  job_ = opts_.group ? opts_.group : world_group();
  const JobGroups groups = split_job();
  const ProcessGroup& world = *groups.world;
  REMAT_CHECK(opts_.dp == 0 || opts_.dp == world.size(), Error, "--dp ", opts_.dp, ": this job has ", world.size(),
              " rank(s); start it with `mpirun -np ", opts_.dp, " ./remat train ...`");
  REMAT_CHECK(c.batch % (world.size() * opts_.grad_accum) == 0, Error, "--grad-accum ", opts_.grad_accum,
              ": the batch of ", c.batch, " sequences must divide into ", world.size(), " rank(s) x ",
              opts_.grad_accum, " micro-batches");
  check_chunks_fit_range(opts_, plan, c.batch / (world.size() * opts_.grad_accum));
  REMAT_CHECK(opts_.zero == 0 || world.size() > 1, Error, "--zero ", opts_.zero,
              " shards over the data-parallel ranks, but this run has one", opts_.pp > 1 ? " per stage" : "",
              "; start it under `mpirun -np N` with N >= 2", opts_.pp > 1 ? " x --pp" : "", " ranks (--dp N)");
  layout_ = make_parallel_layout(groups.world, opts_.ep, c);
  corpus_ = opts_.data_file.empty()        ? generated_corpus(opts_.seed)
            : is_shard_data(opts_.data_file) ? shard_corpus(opts_.data_file, c.seq + 1)
                                             : text_corpus(opts_.data_file, c.seq + 1);
  REMAT_CHECK(corpus_.vocab <= c.vocab, Error, "--data ", opts_.data_file, ": token ids go up to ", corpus_.vocab - 1,
              " but config ", c.name, " has a vocabulary of ", c.vocab, " (./remat train sets it from the shards)");
  manual_seed(opts_.seed);
  build_model(plan, world);
  if (groups.pipeline) build_pipeline(groups.pipeline);
  build_optimizer();
  if (!opts_.resume_dir.empty()) resume(opts_.resume_dir);
}

JobGroups Trainer::split_job() {
  REMAT_CHECK(opts_.pp <= 1 || opts_.device.is_cpu(), Error, "--pp ", opts_.pp,
              ": pipelines run on the CPU under MPI for now (NCCL stages are not built yet)");
  // Tensor-parallel ranks innermost; the ranks of one tensor-parallel rank
  // form the job of the other axes.
  TensorParallelJob split = split_tensor_parallel(job_, opts_.config, opts_.tp, opts_.sp);
  tp_ = std::move(split.tp);
  return split_job_groups(split.rest, opts_.pp, opts_.dp, opts_.config);
}

std::int64_t Trainer::model_parameters() const { return whole_parameters(*model_); }

CommCounters Trainer::comm_counters() const {
  CommCounters c = layout_.counters();
  if (tp_) c = c + tp_->group->counters();
  if (tp_ && tp_->kv_group) c = c + tp_->kv_group->counters();
  return c;
}

void Trainer::build_model(const RecomputePlan& plan, const ProcessGroup& world) {
  const auto& c = opts_.config;
  if (opts_.zero == 3 && world.size() > 1) {
    build_shapes_only();
  } else if (tp_ && !opts_.init_model.empty() && opts_.resume_dir.empty()) {
    build_tp_slices_from_model();
  } else if (!opts_.init_model.empty() && opts_.resume_dir.empty()) {
    {
      SkipWeightInit loaded_next;  // load_hf_weights sets every parameter (or throws)
      model_ = std::make_unique<DecoderModel>(c, opts_.seed, layout_.placement());
    }
    load_hf_weights(*model_, opts_.init_model);
    if (!opts_.adapter.empty()) load_adapter(*model_, opts_.adapter);  // (LoRA: neither --zero nor --tp)
  } else {
    model_ = std::make_unique<DecoderModel>(c, opts_.seed, layout_.placement());
  }
  apply_parallel_layout(*model_, layout_, opts_.reuse_routing_metadata);
  // (built whole from the seed: one process's values; --model: its slices already)
  if (tp_ && !model_->tensor_parallel()) apply_tensor_parallel(*model_, tp_);
  model_->set_compute_dtype(opts_.dtype);
  apply_recompute_plan(*model_, plan);
  REMAT_CHECK(opts_.device.is_cpu() || world.size() == 1, Error, "--device ", opts_.device.str(),
              " with several processes needs the NCCL group in the trainer, which is not wired yet; "
              "run one process per job on CUDA, or the CPU under mpirun");
  // Kernels run where the memory is: a present CUDA device becomes current
  // (an absent one fails in model_->to, naming it).
  use_device_if_present(opts_.device);
  model_->to(opts_.device);  // weights are drawn on the CPU, so every device starts from the same ones
}

// --zero 3: the model is built on meta (shapes, no values); its parameters
// are then CPU tensors without elements, and the optimizer makes each
// rank's shards from their source: seeded weights from each parameter's
// recipe (ranges of the very draws one process makes), --model DIR from
// byte ranges of the folder's tensors, zeros when resuming (resume() then
// reads the rank's ranges of the state). No rank holds the whole model at
// any point.
void Trainer::build_shapes_only() {
  InitRecorder recorder;
  {
    DefaultDeviceScope shapes(kMeta);
    model_ = std::make_unique<DecoderModel>(opts_.config, opts_.seed, layout_.placement());
  }
  if (!opts_.resume_dir.empty()) {
    initial_ = [](const std::string&, std::int64_t, Tensor& out) { out.zero_(); };  // (every value is resumed)
  } else if (!opts_.init_model.empty()) {
    load_hf_weights(*model_, opts_.init_model);  // (on meta: its config and every header checked, nothing read)
    auto files = std::make_shared<const CheckpointFiles>(opts_.init_model);
    initial_ = [files](const std::string& name, std::int64_t begin, Tensor& out) {
      files->read_range_into(name, begin, out);
    };
  } else {
    auto recipes = std::make_shared<std::map<std::string, InitRecipe>>();
    for (const auto& [name, p] : model_->named_parameters()) (*recipes)[name] = recorder.recipe(p);
    initial_ = [recipes](const std::string& name, std::int64_t begin, Tensor& out) {
      fill_init_range(recipes->at(name), begin, out);
    };
  }
  if (tp_) slice_initial_values();
  NoGradGuard ng;
  for (auto& [name, p] : model_->named_parameters()) {
    p.alias_storage_(empty(p.sizes()));  // (a CPU tensor: one parameter's bytes, let go at once)
    p.release_storage();
  }
}

// --zero 3 under --tp: the model on meta keeps this rank's slices' shapes,
// and a range of a slice's elements is read from the whole tensor's source
// run by run (a dim-1 slice row by row), so ZeRO shards the slices.
void Trainer::slice_initial_values() {
  auto whole = std::make_shared<std::map<std::string, Shape>>();
  for (const auto& [name, p] : model_->named_parameters()) (*whole)[name] = p.sizes();
  apply_tensor_parallel(*model_, tp_);
  initial_ = [source = std::move(initial_), whole, c = opts_.config, T = tp_->size(), t = tp_->rank()](
                 const std::string& name, std::int64_t begin, Tensor& out) {
    const TpSlice sl = tp_slice(c, name, T, t);
    if (!sl.split()) return source(name, begin, out);
    Tensor flat = out.view({-1});
    for_each_slice_run(whole->at(name), sl, begin, out.numel(), [&](std::int64_t at, std::int64_t e, std::int64_t n) {
      Tensor part = flat.narrow(0, e - begin, n);
      source(name, at, part);
    });
  };
}

// --tp with --model DIR: the model on meta is checked against the folder's
// config and headers (nothing read), keeps this rank's slices' shapes, and
// each slice is read from the folder by ranges (a dim-1 slice row by row):
// no rank reads or holds a whole tensor it splits.
void Trainer::build_tp_slices_from_model() {
  {
    DefaultDeviceScope shapes(kMeta);
    SkipWeightInit loaded_next;
    model_ = std::make_unique<DecoderModel>(opts_.config, opts_.seed, layout_.placement());
  }
  load_hf_weights(*model_, opts_.init_model);  // (on meta: every name and shape checked)
  std::map<std::string, Shape> whole;
  for (const auto& [name, p] : model_->named_parameters()) whole[name] = p.sizes();
  apply_tensor_parallel(*model_, tp_);
  const CheckpointFiles files(opts_.init_model);
  CategoryScope cat(MemoryCategory::parameter);
  NoGradGuard ng;
  for (auto& [parameter, p] : model_->named_parameters()) {
    const std::string name = parameter;  // (a lambda below reads it)
    Tensor values = empty(p.sizes(), TensorOptions(DType::f32, kCPU));
    Tensor flat = values.view({-1});
    const TpSlice sl = tp_slice(opts_.config, name, tp_->size(), tp_->rank());
    for_each_slice_run(whole.at(name), sl, 0, values.numel(), [&](std::int64_t at, std::int64_t e, std::int64_t n) {
      Tensor part = flat.narrow(0, e, n);
      files.read_range_into(name, at, part);
    });
    p.alias_storage_(values);
  }
}

void Trainer::build_pipeline(std::shared_ptr<ProcessGroup> pipeline_group) {
  const std::vector<std::int64_t> bounds = opts_.pp_split.empty()
                                               ? balanced_stages(*model_, opts_.pp)
                                               : parse_pp_split(opts_.pp_split, opts_.config.n_layers, opts_.pp);
  pipeline_group_ = pipeline_group;
  pipeline_ = std::make_unique<PipelineStage>(*model_, std::move(pipeline_group), bounds, opts_.pp_schedule);
}

void Trainer::build_optimizer() {
  AdamWOptions ao;
  ao.weight_decay = opts_.weight_decay;
  // A stage reduces only its own parameters' gradients over its replicas.
  DataParallelUpdate update = make_data_parallel_update(layout_, trainable_parameters(), opts_.bucket_bytes, opts_.zero, ao,
                                                        *model_, initial_);
  initial_ = nullptr;  // (the recipes or the folder's files, no longer needed)
  reducer_ = std::move(update.reducer);
  optimizer_ = std::move(update.adamw);
  zero_ = std::move(update.zero);
  if (opts_.seq_range)  // (a length per batch, drawn from the same generator)
    sampler_ = std::make_unique<BatchSampler>(corpus_.train_source(), opts_.config.batch, *opts_.seq_range,
                                              opts_.seed + 1);
  else
    sampler_ = std::make_unique<BatchSampler>(corpus_.train_source(), opts_.config.batch, opts_.config.seq,
                                              opts_.seed + 1);
}

std::vector<std::pair<std::string, Tensor>> Trainer::owned_parameters() const {
  return pipeline_ ? pipeline_->parameters() : model_->named_parameters();
}

std::vector<std::pair<std::string, Tensor>> Trainer::trainable_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, p] : owned_parameters())
    if (p.requires_grad()) out.emplace_back(name, p);
  return out;
}

void Trainer::set_loss_scale(double scale, std::int64_t good_steps) {
  REMAT_CHECK(std::isfinite(scale) && scale > 0 && good_steps >= 0, Error,
              "Trainer::set_loss_scale: expected a finite scale > 0 and good_steps >= 0, got ", scale, " and ",
              good_steps);
  scaler_.restore(scale, good_steps);
}

double Trainer::initial_loss_estimate() const { return std::log(double(opts_.config.vocab)); }

double Trainer::global_mean(double local) const {
  return sum_in_rank_order(*layout_.world, local) / double(world_size());
}

double Trainer::evaluate() {
  NoGradGuard ng;
  model_->train(false);
  BatchSampler val(corpus_.val_source(), opts_.config.batch, opts_.config.seq, 0xe7a1ull);
  double total = 0;
  RngShardScope shard(layout_.world->rank(), world_size());  // random routes: this rank's share of the batch's
  Generator& gen = default_generator(opts_.device);
  const RngState rng = gen.state();  // evaluation leaves training's stream alone
  for (std::int64_t i = 0; i < opts_.eval_batches; ++i) {
    const Tensor batch = batch_shard(val.next(), *layout_.world).to(opts_.device);
    if (pipeline_) {
      total += pipeline_->eval_ce(batch);  // (one micro-batch of keyed streams, as below)
      continue;
    }
    const RngState streams = gen.state();
    {
      RngStreamScope keyed(gen, streams, 0, opts_.config.n_layers);
      total += model_->forward_loss(batch).ce.item();
    }
    gen.set_state(rng_streams_end(streams, 1, opts_.config.n_layers));
  }
  gen.set_state(rng);
  model_->train(true);
  return global_mean(total / double(std::max<std::int64_t>(opts_.eval_batches, 1)));
}

// ---- the training loop ---------------------------------------------------------

using Clock = std::chrono::steady_clock;

struct Trainer::RunState {
  std::int64_t first = 0, stop = 0;  // the step run() started at, the one it stops at
  Clock::time_point start;
  NonFinitePolicy nonfinite;
  std::int64_t overflows = 0;  // f16 overflow steps skipped
};

struct Trainer::StepStart {
  Clock::time_point t0;
  std::int64_t attempt = 0;  // the 1-based step this iteration tries
  Tensor batch;              // this rank's share of the global batch: [rows, S + 1]
  // The running counters this step's figures are differences of.
  std::int64_t recomputed_ops = 0;
  DynamicRematStats dynamic;
  OffloadStats offload;
  CompressHooks::Stats compress;
  DispatchCounters moved;
  CommCounters comm, pipeline_comm;
};

struct Trainer::StepLoss {
  double loss = 0;                     // the mean over micro-batches (or the first non-finite one)
  PipelineStage::StepResult pipeline;  // --pp: this stage's timings
};

void Trainer::run(const std::function<void(const StepStats&)>& on_step) {
  const std::int64_t stop = opts_.stop_after > 0 ? std::min(opts_.steps, step_ + opts_.stop_after) : opts_.steps;
  RunState run{step_, stop, Clock::now(), NonFinitePolicy(opts_.on_nonfinite, opts_.max_nonfinite_skips), 0};
  while (step_ < run.stop) {
    const StepStats s = one_step(run);
    if (on_step) on_step(s);
  }
  // Resumed at the last step: no step ran, and --save still gets the state
  // (a copy of the one resumed, in this run's layout: a sharded set under --zero).
  if (run.first >= run.stop && !opts_.save_dir.empty()) save(opts_.save_dir);
}

StepStats Trainer::train_step() {
  REMAT_CHECK(step_ < opts_.steps, Error, "Trainer::train_step: the run's ", opts_.steps,
              " steps are done (make a Trainer with more steps, resuming from a save, to go on)");
  if (!stepping_)
    stepping_ = std::make_unique<RunState>(
        RunState{step_, opts_.steps, Clock::now(), NonFinitePolicy(opts_.on_nonfinite, opts_.max_nonfinite_skips), 0});
  return one_step(*stepping_);
}

// One iteration of the run: a step (or a skipped attempt), its figures,
// and the evaluation and save due after it.
StepStats Trainer::one_step(RunState& run) {
  model_->train(true);
  const StepStart start = begin_step();
  const double lr = schedule_lr(opts_.schedule, step_, opts_.warmup, opts_.steps, opts_.lr, opts_.min_lr);
  StepStats s;
  s.loss_scale = scaler_.scale();  // (the one backward is seeded with)
  const StepLoss loss = micro_steps(start.batch, start.attempt, s);
  apply_update(loss.loss, lr, start.attempt, run, s);
  collect_stats(start, run, lr, loss, s);
  if (!s.skipped) evaluate_and_save(run.stop, s);
  return s;
}

Trainer::~Trainer() = default;

Trainer::StepStart Trainer::begin_step() {
  StepStart start;
  start.t0 = Clock::now();
  allocator_for(opts_.device).reset_peak();
  start.attempt = step_ + 1;
  // Every rank draws the same global batch and takes its own sequences.
  start.batch = batch_shard(sampler_->next(), *layout_.world).to(opts_.device);
  model_->zero_grad();
  if (ShardedGradReducer* sharded = sharded_reducer()) sharded->zero();
  reset_saved_bytes_peak();
  const BlockStack& blocks = model_->block_stack();
  start.recomputed_ops = checkpoint_counters().ops_recomputed;
  if (blocks.dynamic_remat()) start.dynamic = blocks.dynamic_remat()->stats();
  start.offload = blocks.offload_hooks() ? blocks.offload_hooks()->stats() : OffloadStats{};
  start.compress = blocks.compress_hooks() ? blocks.compress_hooks()->stats() : CompressHooks::Stats{};
  start.moved = dispatch_counters();
  start.comm = comm_counters();
  start.pipeline_comm = pipeline_group_ ? pipeline_group_->counters() : CommCounters{};
  return start;
}

// Micro-batches: forward then backward of each in turn (a pipeline runs
// them in its schedule's order), gradients summed; each loss weighted 1/M,
// so the step's loss and gradient are the whole batch's. A non-finite
// micro-batch loss ends the step there.
Trainer::StepLoss Trainer::micro_steps(const Tensor& batch, std::int64_t attempt, StepStats& s) {
  CategoryScope cat(MemoryCategory::activation);
  RngShardScope shard(layout_.world->rank(), world_size());  // dropout masks and random routes: this rank's share
  // --recompute dynamic: evictions under the budget through every forward and backward.
  const DynamicRematScope dynamic(model_->block_stack().dynamic_remat());
  StepLoss r;
  s.aux_loss = 0;
  r.loss = pipeline_ ? pipeline_micro_steps(batch, attempt, s, r.pipeline) : local_micro_steps(batch, attempt, s);
  if (reducer_) reducer_->finish();  // (nothing to do unless the last micro-batch ran)
  if (ShardedGradReducer* sharded = sharded_reducer()) sharded->finish();  // (the pipeline's last backward)
  if (zero_ && zero_->gatherer()) zero_->gatherer()->release_all();  // (a unit a rank's experts kept gathered)
  return r;
}

double Trainer::local_micro_steps(const Tensor& batch, std::int64_t attempt, StepStats& s) {
  // Block b of micro-batch m draws from stream (m, b) (engine/rng.h): the
  // same masks and routes under any pipeline schedule.
  Generator& gen = default_generator(opts_.device);
  const RngState streams = gen.state();
  const std::int64_t M = opts_.grad_accum, rows = batch.size(0) / M, blocks = opts_.config.n_layers;
  double loss = 0;
  for (std::int64_t m = 0; m < M; ++m) {
    Tensor mb = M == 1 ? batch : batch.narrow(0, m * rows, rows);
    RngStreamScope keyed(gen, streams, m, blocks);
    auto out = model_->forward_loss(mb);
    if (m == M - 1) s.routing = out.routing;  // (the last micro-batch's)
    const auto report = saved_bytes_report();
    auto it = report.bytes_by_op.find("checkpoint_boundary");
    s.boundary_bytes = std::max(s.boundary_bytes, it == report.bytes_by_op.end() ? 0 : it->second);
    const double local = out.loss.item(), aux = out.aux.item();  // (aux: global-batch statistics already)
    if (!add_micro_loss(attempt, m, local, aux, loss, s)) break;
    // The reducer is armed for the last micro-batch only, whose backward
    // completes each gradient's sum over the ranks.
    if (reducer_ && m == M - 1) reducer_->prepare();
    // --zero 2: every micro-batch's gradients are reduce-scattered into the shards.
    ShardedGradReducer* sharded = sharded_reducer();
    if (sharded) sharded->prepare();
    const double seed = backward_seed(attempt);
    out.loss.backward(seed != 1.0 ? full({}, seed, TensorOptions(out.loss.dtype(), out.loss.device())) : Tensor());
    if (sharded) sharded->finish();
  }
  gen.set_state(rng_streams_end(streams, M, blocks));
  return loss;
}

double Trainer::pipeline_micro_steps(const Tensor& batch, std::int64_t attempt, StepStats& s,
                                     PipelineStage::StepResult& timing) {
  // The stages run the micro-batches in their schedule's order (and set the
  // generator past their streams); every rank gets every micro-batch's loss
  // (the same bits as one process). The stage's replicas reduce its
  // gradients, armed before its last backward.
  const std::int64_t M = opts_.grad_accum;
  std::function<void()> arm;
  if (reducer_ || sharded_reducer()) arm = [this] {
    if (reducer_) reducer_->prepare();
    if (ShardedGradReducer* sharded = sharded_reducer()) sharded->prepare();
  };
  timing = pipeline_->step(batch, M, backward_seed(attempt), arm);
  s.pipeline_in_flight = timing.peak_in_flight;
  double loss = 0;
  for (std::int64_t m = 0; m < M; ++m)
    if (!add_micro_loss(attempt, m, timing.loss[std::size_t(m)], timing.aux[std::size_t(m)], loss, s)) break;
  return loss;
}

// Micro-batch m's loss on this rank, `local`, becomes the mean over the
// ranks (the same bits on every rank, added in rank order, so every rank
// takes the same decision on a non-finite loss) and is added to the step's
// `loss` weighted 1/M, with its `aux`. False, with `loss` set to it, when it
// is not finite.
bool Trainer::add_micro_loss(std::int64_t attempt, std::int64_t micro, double local, double aux, double& loss,
                             StepStats& s) const {
  const double M = double(opts_.grad_accum);
  if (opts_.fault_loss && micro == 0) opts_.fault_loss(attempt, local);
  const double mean = global_mean(local);
  loss += mean / M;
  s.aux_loss += aux / M;
  if (std::isfinite(mean)) return true;
  loss = mean;
  return false;
}

// The global loss is the mean of the ranks' losses: each rank seeds 1/(W M)
// (times the f16 loss scale), and gradients are summed over ranks.
double Trainer::backward_seed(std::int64_t attempt) const {
  double seed = scaler_.scale() / double(world_size()) / double(opts_.grad_accum);
  if (opts_.fault_seed) opts_.fault_seed(attempt, seed);
  return seed;
}

// A non-finite value: stop (before any update or save), or skip the update
// and try this step again on the next batch. An f16 overflow: skip, halve
// the scale. Otherwise unscale, clip, step.
void Trainer::apply_update(double loss, double lr, std::int64_t attempt, RunState& run, StepStats& s) {
  if (!std::isfinite(loss)) {
    s.grad_norm = std::numeric_limits<double>::quiet_NaN();  // backward did not run
    run.nonfinite.reject(attempt, "loss", loss, loss, stop_note());
    s.skipped = true;
    return;
  }
  const std::vector<Tensor> params = update_tensors();
  s.grad_norm = grad_norm();
  if (scaler_.overflowed(s.grad_norm)) {  // normal operation: drop the update, halve the scale
    ++run.overflows;
    s.skipped = s.overflow = true;
    scaler_.back_off(attempt, s.grad_norm, loss, stop_note());
    return;
  }
  scaler_.unscale(params, s.grad_norm);
  if (!std::isfinite(s.grad_norm)) {
    run.nonfinite.reject(attempt, "gradient norm", s.grad_norm, loss, stop_note());
    s.skipped = true;
    return;
  }
  clip_grads_to(params, s.grad_norm, opts_.clip);
  if (zero_)
    zero_->step(lr);
  else
    optimizer_->step(lr);
  ++step_;
  run.nonfinite.updated();
  scaler_.grow();
}

std::vector<Tensor> Trainer::update_tensors() {
  // A parameter backward did not reach (a routed expert no token chose)
  // gets a zero gradient, so AdamW treats it the same whether or not an
  // earlier step of this process left a gradient buffer behind (a resumed
  // run then continues exactly as an uninterrupted one). --zero 2: the
  // sharded parameters' gradients are the reducer's shards.
  std::vector<Tensor> whole;
  if (zero_ && zero_->stage() >= 2) {
    whole = zero_->unsharded();
  } else {
    for (auto& [name, p] : trainable_parameters()) whole.push_back(p);
  }
  give_gradient_buffers(whole);
  return zero_ ? zero_->bind_grads() : whole;
}

// The gradients are the same on every rank (summed over ranks; the experts'
// squares summed in rank order), so is the norm, and so is the decision
// taken on it. A pipeline adds every stage's partials in stage order (one
// process's sum); expert parallelism sums the experts' squares over the
// expert-parallel group (the rest is the same on every rank).
double Trainer::grad_norm() const {
  auto squares = [&](const std::vector<Tensor>& ts) {
    return pipeline_ ? pipeline_->sum_over_stages(grad_sq_partials(ts)) : grad_sq_sum(ts);
  };
  // --zero 2: each rank holds its shards of the dense gradients; their
  // squares are summed over the replicas in rank order (then over stages).
  // --tp: a slice's squares on the first rank that holds it, summed over
  // the tensor-parallel ranks in rank order; replicated parameters have the
  // same gradient on every one of them.
  const bool sharded = zero_ && zero_->stage() >= 2;
  std::vector<Tensor> dense, experts, slices;
  for (auto& [name, p] : trainable_parameters()) {
    const TpSlice sl = tp_ ? tp_slice(opts_.config, name, tp_->size(), tp_->rank()) : TpSlice{};
    if (sl.split()) {
      if (!sharded && sl.first_holder(tp_->rank(), tp_->size())) slices.push_back(p);
    } else if (layout_.ep > 1 && is_expert_parameter(name)) {
      experts.push_back(p);
    } else if (!sharded) {
      dense.push_back(p);
    }
  }
  const double slice_sq = tp_ ? sum_in_rank_order(*tp_->group, squares(slices)) : 0.0;
  double dense_sq = 0;
  if (sharded) {
    // (under --tp: the pieces of slices apart, summed over the ranks of the slices too)
    std::vector<Tensor> whole_pieces, slice_pieces;
    const std::vector<Tensor> pieces = zero_->shard_pieces();
    const std::vector<std::string> of = zero_->shard_piece_parameters();
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const TpSlice sl = tp_ ? tp_slice(opts_.config, of[i], tp_->size(), tp_->rank()) : TpSlice{};
      if (!sl.split()) whole_pieces.push_back(pieces[i]);
      else if (sl.first_holder(tp_->rank(), tp_->size())) slice_pieces.push_back(pieces[i]);
    }
    double shards = sum_in_rank_order(*layout_.world, grad_sq_sum(whole_pieces));
    if (tp_) shards += sum_in_rank_order(*tp_->group, sum_in_rank_order(*layout_.world, grad_sq_sum(slice_pieces)));
    dense_sq = pipeline_ ? pipeline_->sum_over_stages({shards}) : shards;
  } else {
    dense_sq = squares(dense) + slice_sq;
  }
  if (layout_.ep == 1) return std::sqrt(dense_sq);
  return std::sqrt(dense_sq + sum_in_rank_order(*layout_.ep_group, squares(experts)));
}

// What a stopped run says about the state on disk (no save happens after the failing step).
std::string Trainer::stop_note() const {
  std::string note = "; stopped before the update, nothing saved after step " + std::to_string(step_);
  if (!opts_.save_dir.empty()) note += " (" + opts_.save_dir + "/state.safetensors is left as it was)";
  return note;
}

void Trainer::collect_counters(const StepStart& start, StepStats& s) const {
  const BlockStack& blocks = model_->block_stack();
  if (const auto& off = blocks.offload_hooks()) {
    off->check();  // a failed write: stop here, with the tensors it kept (nothing is lost)
    const OffloadStats os = off->stats();
    s.offloaded_bytes = (os.bytes_written + os.bytes_to_host) - (start.offload.bytes_written + start.offload.bytes_to_host);
    s.offload_stored_peak = os.stored_peak;
    s.offload_wait_ms = double(os.wait_ns - start.offload.wait_ns) * 1e-6;
  }
  if (const auto& comp = blocks.compress_hooks())
    s.compressed_saved_bytes = comp->stats().compressed_bytes - start.compress.compressed_bytes;
  s.recomputed_ops = checkpoint_counters().ops_recomputed - start.recomputed_ops;
  if (const auto& dyn = blocks.dynamic_remat()) {
    const DynamicRematStats d = dyn->stats();
    s.memory_budget_bytes = dyn->options().budget;
    s.evictions = d.evictions - start.dynamic.evictions;
    s.evicted_bytes = d.evicted_bytes - start.dynamic.evicted_bytes;
    s.rebuilds = d.rebuilds - start.dynamic.rebuilds;
    s.rebuild_ms = d.rebuild_ms - start.dynamic.rebuild_ms;
  }
  const DispatchCounters moved = dispatch_counters();
  s.moved_bytes = moved.bytes_moved - start.moved.bytes_moved;
  s.replayed_comm_bytes = moved.replay_bytes_moved - start.moved.replay_bytes_moved;
  s.routing_metadata_saved_bytes = moved.metadata_bytes_saved - start.moved.metadata_bytes_saved;
  s.saved_bytes_peak = saved_bytes_report().peak_bytes;
  if (reducer_) {
    s.grad_buckets = reducer_->stats().buckets;
    s.grad_buckets_overlapped = reducer_->stats().started_in_backward;
  }
}

void Trainer::collect_stats(const StepStart& start, const RunState& run, double lr, const StepLoss& loss,
                            StepStats& s) {
  collect_counters(start, s);
  const auto t1 = Clock::now();
  const auto mem = allocator_for(opts_.device).stats();
  s.step = start.attempt;
  s.total_steps = opts_.steps;
  s.loss = loss.loss;
  s.lr = lr;
  s.skipped_steps = run.nonfinite.skipped();
  s.overflow_steps = run.overflows;
  s.step_ms = std::chrono::duration<double, std::milli>(t1 - start.t0).count();
  s.seq = start.batch.size(1) - 1;  // (this batch's length: config.seq, or drawn from --seq-range)
  s.tokens_per_s = double(opts_.config.batch * s.seq) / (s.step_ms * 1e-3);
  s.grad_accum = opts_.grad_accum;
  s.elapsed_s = std::chrono::duration<double>(t1 - run.start).count();
  s.eta_s = step_ > run.first ? s.elapsed_s / double(step_ - run.first) * double(opts_.steps - step_) : 0.0;
  s.peak_allocated_bytes = mem.allocated_peak;
  s.peak_reserved_bytes = mem.reserved_peak;
  // (A pipeline stage holds only its own parameters: the others' are released.)
  s.persistent_bytes = zero_ ? zero_->persistent_bytes() : persistent_bytes(owned_parameters(), *optimizer_);
  s.activation_bytes = s.peak_allocated_bytes - s.persistent_bytes;
  s.comm = comm_counters() - start.comm;
  if (!pipeline_) return;
  s.comm = s.comm + (pipeline_group_->counters() - start.pipeline_comm);
  PipelineStageStats mine = pipeline_->stage_stats(loss.pipeline);
  mine.peak_allocated_bytes = s.peak_allocated_bytes;
  mine.activation_bytes = s.activation_bytes;
  s.pipeline_stages = pipeline_->gather_stats(mine);
}

void Trainer::evaluate_and_save(std::int64_t stop, StepStats& s) {
  if ((opts_.eval_every > 0 && step_ % opts_.eval_every == 0) || step_ == stop) s.val_loss = evaluate();
  if (!opts_.save_dir.empty() && ((opts_.save_every > 0 && step_ % opts_.save_every == 0) || step_ == stop))
    save(opts_.save_dir);
}

}  // namespace remat
