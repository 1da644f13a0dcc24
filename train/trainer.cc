#include "train/trainer.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "engine/autograd.h"
#include "engine/device_runtime.h"
#include "engine/rng.h"
#include "models/recompute.h"
#include "moe/dispatch.h"
#include "train/hf_model.h"
#include "train/safetensors.h"
#include "train/state_files.h"

namespace remat {

namespace {
// A double as text that reads back to the same bits.
std::string format_exact(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}
constexpr const char* kFormat = "remat-train-state-1";

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

// A routed expert's name (or its optimizer state's) -> the position of its
// index and the index; npos when not a routed expert's (models/moe_layer.h).
std::pair<std::size_t, std::int64_t> expert_index(const std::string& name) {
  const RoutedExpertName r = routed_expert_name(name);
  return {r.at, r.expert};
}
}  // namespace

namespace {
// Every option a library user can set wrong, checked before anything is
// built: the message names the option (and its flag), the value and the range.
void validate_options(const TrainOptions& o) {
  auto real = [](const char* name, double v, double lo, bool lo_open, const char* range) {
    REMAT_CHECK(std::isfinite(v) && (lo_open ? v > lo : v >= lo), Error, "TrainOptions.", name, " must be ", range,
                ", got ", v);
  };
  auto integer = [](const char* name, std::int64_t v, std::int64_t lo) {
    REMAT_CHECK(v >= lo, Error, "TrainOptions.", name, " must be >= ", lo, ", got ", v);
  };
  integer("steps (--steps)", o.steps, 1);
  integer("stop_after (--stop-after)", o.stop_after, 0);
  integer("warmup (--warmup)", o.warmup, 0);
  integer("grad_accum (--grad-accum)", o.grad_accum, 1);
  REMAT_CHECK(o.schedule == "cosine" || o.schedule == "linear" || o.schedule == "constant", Error,
              "TrainOptions.schedule (--schedule) must be cosine, linear or constant, got '", o.schedule, "'");
  real("lr (--lr)", o.lr, 0, true, "a finite number > 0");
  real("min_lr", o.min_lr, 0, false, "a finite number >= 0");
  REMAT_CHECK(o.min_lr <= o.lr, Error, "TrainOptions.min_lr must be <= lr (", o.lr, "), got ", o.min_lr);
  real("clip", o.clip, 0, false, "a finite number >= 0 (0: no clipping)");
  real("weight_decay", o.weight_decay, 0, false, "a finite number >= 0");
  integer("eval_every (--eval-every)", o.eval_every, 0);
  integer("eval_batches", o.eval_batches, 1);
  integer("save_every (--save-every)", o.save_every, 0);
  integer("dp (--dp)", o.dp, 0);
  integer("ep (--ep)", o.ep, 1);
  integer("bucket_bytes (--bucket-mb)", o.bucket_bytes, 1);
  REMAT_CHECK(o.on_nonfinite == "stop" || o.on_nonfinite == "skip", Error,
              "TrainOptions.on_nonfinite (--on-nonfinite) must be stop or skip, got '", o.on_nonfinite, "'");
  integer("max_nonfinite_skips (--max-nonfinite-skips)", o.max_nonfinite_skips, 1);
  real("loss_scale_min", o.loss_scale_min, 0, true, "a finite number > 0");
  real("loss_scale_init", o.loss_scale_init, 0, true, "a finite number > 0");
  REMAT_CHECK(o.loss_scale_init >= o.loss_scale_min, Error, "TrainOptions.loss_scale_init must be >= loss_scale_min (",
              o.loss_scale_min, "), got ", o.loss_scale_init);
  integer("loss_scale_growth_interval", o.loss_scale_growth_interval, 1);
}
}  // namespace

Trainer::Trainer(TrainOptions opts) : opts_(std::move(opts)) {
  validate_options(opts_);
  opts_.config.validate();
  const auto& c = opts_.config;
  RecomputePlan plan = RecomputePlan::parse(opts_.recompute, c.n_layers);
  plan.offload_dir = opts_.offload_dir;
  job_ = opts_.group ? opts_.group : world_group();
  auto world = job_;
  std::shared_ptr<ProcessGroup> pipeline_group;
  if (opts_.pp > 1) {
    // pp x dp ranks, stage-major: rank s * D + d runs stage s of data-parallel
    // replica d. Replica d's stages form a pipeline; stage s's D replicas
    // share each batch (and split the experts under --ep) as data parallel does.
    auto refuse = [&](bool bad, const std::string& what) {
      REMAT_CHECK(!bad, Error, "--pp ", opts_.pp, ": ", what);
    };
    const int P = int(opts_.pp), N = job_->size();
    refuse(N % P != 0, "this job has " + std::to_string(N) + " rank(s), not a multiple of " + std::to_string(P) +
           " stages; start it with `mpirun -np " + std::to_string(P) + " ./remat train ... --pp " +
           std::to_string(P) + "` (one rank per stage), or P x D ranks for D data-parallel replicas");
    const int D = N / P;
    refuse(opts_.dp > 0 && opts_.dp != D, "--dp " + std::to_string(opts_.dp) + " needs " +
           std::to_string(P * opts_.dp) + " ranks (pp x dp), this job has " + std::to_string(N));
    refuse(c.tie_embeddings, "tied embeddings live on the first and the last stage; not built yet");
    refuse(!opts_.device.is_cpu(), "pipelines run on the CPU under MPI for now (NCCL stages are not built yet)");
    const int stage = job_->rank() / D, replica = job_->rank() % D;
    pipeline_group = job_->split(replica, stage);  // (collectives over the job: every rank, in this order)
    world = D == 1 ? single_process_group() : job_->split(stage, replica);
  } else {
    REMAT_CHECK(opts_.pp == 1, Error, "--pp must be >= 1, got ", opts_.pp);
  }
  REMAT_CHECK(opts_.dp == 0 || opts_.dp == world->size(), Error, "--dp ", opts_.dp, ": this job has ", world->size(),
              " rank(s); start it with `mpirun -np ", opts_.dp, " ./remat train ...`");
  REMAT_CHECK(c.batch % (world->size() * opts_.grad_accum) == 0, Error, "--grad-accum ", opts_.grad_accum,
              ": the batch of ", c.batch, " sequences must divide into ", world->size(), " rank(s) x ",
              opts_.grad_accum, " micro-batches");
  layout_ = make_parallel_layout(world, opts_.ep, c);
  corpus_ = opts_.data_file.empty()        ? generated_corpus(opts_.seed)
            : is_shard_data(opts_.data_file) ? shard_corpus(opts_.data_file, c.seq + 1)
                                             : text_corpus(opts_.data_file, c.seq + 1);
  REMAT_CHECK(corpus_.vocab <= c.vocab, Error, "--data ", opts_.data_file, ": token ids go up to ", corpus_.vocab - 1,
              " but config ", c.name, " has a vocabulary of ", c.vocab, " (./remat train sets it from the shards)");
  manual_seed(opts_.seed);
  if (!opts_.init_model.empty() && opts_.resume_dir.empty()) {
    {
      SkipWeightInit loaded_next;  // load_hf_weights sets every parameter (or throws)
      model_ = std::make_unique<DecoderModel>(c, opts_.seed, layout_.placement());
    }
    load_hf_weights(*model_, opts_.init_model);
  } else {
    model_ = std::make_unique<DecoderModel>(c, opts_.seed, layout_.placement());
  }
  apply_parallel_layout(*model_, layout_, opts_.reuse_routing_metadata);
  model_->set_compute_dtype(compute_dtype_from_name(opts_.dtype));
  scaling_ = model_->compute_dtype() == DType::f16;
  if (scaling_) loss_scale_ = opts_.loss_scale_init;
  apply_recompute_plan(*model_, plan);
  REMAT_CHECK(opts_.device.is_cpu() || world->size() == 1, Error, "--device ", opts_.device.str(),
              " with several processes needs the NCCL group in the trainer, which is not wired yet; "
              "run one process per job on CUDA, or the CPU under mpirun");
  // Kernels run where the memory is: a present CUDA device becomes current
  // (an absent one fails in model_->to, naming it).
  use_device_if_present(opts_.device);
  model_->to(opts_.device);  // weights are drawn on the CPU, so every device starts from the same ones
  if (pipeline_group) {
    std::vector<std::int64_t> bounds;
    if (!opts_.pp_split.empty()) {
      bounds = parse_pp_split(opts_.pp_split, c.n_layers, opts_.pp);
    } else {
      std::vector<std::int64_t> block_params;
      for (const auto& layer : model_->model->layers) block_params.push_back(layer->num_parameters());
      bounds = balanced_stages(block_params, model_->model->embed_tokens->num_parameters(),
                               model_->model->norm->num_parameters() + model_->output_weight().numel(), opts_.pp);
    }
    pipeline_group_ = pipeline_group;
    pipeline_ = std::make_unique<PipelineStage>(*model_, pipeline_group, bounds,
                                                parse_pipeline_schedule(opts_.pp_schedule));
  }
  // A stage reduces only its own parameters' gradients over its replicas.
  reducer_ = make_grad_reducer(layout_, pipeline_ ? pipeline_->parameters() : model_->named_parameters(),
                               opts_.bucket_bytes);
  AdamWOptions ao;
  ao.weight_decay = opts_.weight_decay;
  optimizer_ = std::make_unique<AdamW>(pipeline_ ? pipeline_->parameters() : model_->named_parameters(), ao);
  sampler_ = std::make_unique<BatchSampler>(corpus_.train_source(), c.batch, c.seq, opts_.seed + 1);
  if (!opts_.resume_dir.empty()) resume(opts_.resume_dir);
}

void Trainer::set_loss_scale(double scale, std::int64_t good_steps) {
  REMAT_CHECK(std::isfinite(scale) && scale > 0 && good_steps >= 0, Error,
              "Trainer::set_loss_scale: expected a finite scale > 0 and good_steps >= 0, got ", scale, " and ",
              good_steps);
  loss_scale_ = scaling_ ? scale : 1.0;
  good_steps_ = scaling_ ? good_steps : 0;
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

void Trainer::run(const std::function<void(const StepStats&)>& on_step) {
  const auto& c = opts_.config;
  auto& alloc = allocator_for(opts_.device);
  const auto t_start = std::chrono::steady_clock::now();
  const std::int64_t first = step_;
  model_->train(true);
  const std::int64_t stop = opts_.stop_after > 0 ? std::min(opts_.steps, first + opts_.stop_after) : opts_.steps;
  const bool skip_nonfinite = opts_.on_nonfinite == "skip";
  std::int64_t skipped = 0, overflows = 0, in_row = 0;  // non-finite skips (in all, in a row), f16 overflows
  // What a stopped run says about the state on disk (no save happens after the failing step).
  auto stop_note = [&] {
    std::string note = "; stopped before the update, nothing saved after step " + std::to_string(step_);
    if (!opts_.save_dir.empty()) note += " (" + opts_.save_dir + "/state.safetensors is left as it was)";
    return note;
  };
  while (step_ < stop) {
    const auto t0 = std::chrono::steady_clock::now();
    alloc.reset_peak();
    const std::int64_t attempt = step_ + 1;  // the 1-based step this iteration tries
    const double lr = schedule_lr(opts_.schedule, step_, opts_.warmup, opts_.steps, opts_.lr, opts_.min_lr);
    // Every rank draws the same global batch and takes its own sequences.
    Tensor batch = batch_shard(sampler_->next(), *layout_.world).to(opts_.device);
    model_->zero_grad();
    reset_saved_bytes_peak();
    const std::int64_t ops0 = checkpoint_counters().ops_recomputed;
    const OffloadStats off0 = model_->model->blocks->offload_hooks() ? model_->model->blocks->offload_hooks()->stats()
                                                                      : OffloadStats{};
    const CompressHooks::Stats comp0 =
        model_->model->blocks->compress_hooks() ? model_->model->blocks->compress_hooks()->stats() : CompressHooks::Stats{};
    const DispatchCounters moved0 = dispatch_counters();
    const CommCounters comm0 = layout_.counters();
    const CommCounters pipeline_comm0 = pipeline_group_ ? pipeline_group_->counters() : CommCounters{};
    const int W = world_size();
    double loss;
    StepStats s;
    PipelineStage::StepResult pipeline_step;
    s.loss_scale = loss_scale_;
    {
      CategoryScope cat(MemoryCategory::activation);
      RngShardScope shard(layout_.world->rank(), W);  // dropout masks and random routes: this rank's share of the batch's
      // Block b of micro-batch m draws from stream (m, b) (engine/rng.h): the
      // same masks and routes under any pipeline schedule.
      Generator& gen = default_generator(opts_.device);
      const RngState streams = gen.state();
      // Micro-batches: forward then backward of each in turn, gradients
      // summed; each loss weighted 1/M, so the step's loss and gradient are
      // the whole batch's. A non-finite micro-batch loss ends the step there.
      const std::int64_t M = opts_.grad_accum, rows = batch.size(0) / M;
      loss = 0;
      s.aux_loss = 0;
      if (pipeline_) {
        // The stages run the micro-batches in their schedule's order; every
        // rank gets every micro-batch's loss (the same bits as one process).
        // Each rank seeds 1/(W M) as below; the stage's replicas reduce
        // its gradients, armed before its last backward.
        double seed = loss_scale_ / double(W) / double(M);
        if (opts_.fault_seed) opts_.fault_seed(attempt, seed);
        std::function<void()> arm;
        if (reducer_) arm = [this] { reducer_->prepare(); };
        pipeline_step = pipeline_->step(batch, M, seed, arm);
        auto& r = pipeline_step;
        if (opts_.fault_loss) opts_.fault_loss(attempt, r.loss[0]);
        for (std::int64_t m = 0; m < M; ++m) {
          const double micro = global_mean(r.loss[std::size_t(m)]);
          loss += micro / double(M);
          s.aux_loss += r.aux[std::size_t(m)] / double(M);
          if (!std::isfinite(micro)) {
            loss = micro;
            break;
          }
        }
        s.pipeline_in_flight = r.peak_in_flight;
      }
      for (std::int64_t m = 0; m < (pipeline_ ? 0 : M); ++m) {
        Tensor mb = M == 1 ? batch : batch.narrow(0, m * rows, rows);
        RngStreamScope keyed(gen, streams, m, c.n_layers);
        auto out = model_->forward_loss(mb);
        double local = out.loss.item();
        if (opts_.fault_loss && m == 0) opts_.fault_loss(attempt, local);
        // The same bits on every rank (added in rank order), so every rank
        // takes the same decision on a non-finite loss.
        const double micro = global_mean(local);
        loss += micro / double(M);
        s.aux_loss += out.aux.item() / double(M);  // global-batch statistics already
        if (m == M - 1) s.routing = out.routing;  // (the last micro-batch's)
        const auto report = saved_bytes_report();
        auto it = report.bytes_by_op.find("checkpoint_boundary");
        s.boundary_bytes = std::max(s.boundary_bytes, it == report.bytes_by_op.end() ? 0 : it->second);
        if (!std::isfinite(micro)) {
          loss = micro;
          break;
        }
        // The global loss is the mean of the ranks' losses: each rank seeds
        // 1/(W M) (times the f16 loss scale), and gradients are summed over
        // ranks: the reducer is armed for the last micro-batch only, whose
        // backward completes each gradient's sum.
        if (reducer_ && m == M - 1) reducer_->prepare();
        double seed = loss_scale_ / double(W) / double(M);
        if (opts_.fault_seed) opts_.fault_seed(attempt, seed);
        const TensorOptions seed_opts(out.loss.dtype(), out.loss.device());
        out.loss.backward(seed != 1.0 ? full({}, seed, seed_opts) : Tensor());
      }
      if (!pipeline_) gen.set_state(rng_streams_end(streams, M, c.n_layers));  // (the stages set it themselves)
      if (reducer_) reducer_->finish();  // (nothing to do unless the last micro-batch ran)
    }
    // A non-finite value: stop (before any update or save), or skip the
    // update and try this step again on the next batch.
    auto reject = [&](const char* what, double value) {
      std::ostringstream msg;
      msg << "step " << attempt << ": the " << what << " is " << (std::isnan(value) ? "nan" : value > 0 ? "inf" : "-inf")
          << " (not finite)";
      if (std::string(what) != "loss") msg << ", loss " << loss;
      if (skip_nonfinite && in_row >= opts_.max_nonfinite_skips)
        msg << ", and the " << in_row << " step(s) before it were skipped for non-finite values"
            << " (--max-nonfinite-skips " << opts_.max_nonfinite_skips << ")";
      if (!skip_nonfinite || in_row >= opts_.max_nonfinite_skips) {
        msg << stop_note();
        if (!skip_nonfinite) msg << "; lower --lr, or --on-nonfinite skip to drop such steps";
        throw NonFiniteError(msg.str(), attempt, value);
      }
      ++in_row;
      ++skipped;
      s.skipped = true;
    };
    std::vector<Tensor> params;
    if (pipeline_) {
      for (auto& [name, p] : pipeline_->parameters()) params.push_back(p);
    } else {
      params = model_->parameters();
    }
    if (!std::isfinite(loss)) {
      s.grad_norm = std::numeric_limits<double>::quiet_NaN();  // backward did not run
      reject("loss", loss);
    } else {
      // A parameter backward did not reach (a routed expert no token chose)
      // gets a zero gradient, so AdamW treats it the same whether or not an
      // earlier step of this process left a gradient buffer behind (a resumed
      // run then continues exactly as an uninterrupted one).
      for (const Tensor& p : params)
        if (!p.grad().defined()) {
          CategoryScope grad_cat(MemoryCategory::gradient);
          p.set_grad(zeros(p.sizes(), p.device()));
        }
      // The gradients are the same on every rank (summed over ranks; the
      // experts' squares summed in rank order), so is the norm, and so is
      // the decision taken on it.
      double sq;
      if (pipeline_ && layout_.ep > 1) {
        // As below, each part's partials added over the stages first.
        std::vector<Tensor> dense, experts;
        for (auto& [name, p] : pipeline_->parameters()) (is_expert_parameter(name) ? experts : dense).push_back(p);
        sq = pipeline_->sum_over_stages(grad_sq_partials(dense)) +
             sum_in_rank_order(*layout_.ep_group, pipeline_->sum_over_stages(grad_sq_partials(experts)));
      } else if (pipeline_) {
        sq = pipeline_->sum_over_stages(grad_sq_partials(params));  // every stage's partials in order: one process's sum
      } else if (layout_.ep > 1) {
        // Experts are split over the expert-parallel group: their squares are
        // summed over it; the rest is the same on every rank.
        std::vector<Tensor> dense, experts;
        for (auto& [name, p] : model_->named_parameters()) (is_expert_parameter(name) ? experts : dense).push_back(p);
        sq = grad_sq_sum(dense) + sum_in_rank_order(*layout_.ep_group, grad_sq_sum(experts));
      } else {
        sq = grad_sq_sum(params);
      }
      s.grad_norm = std::sqrt(sq);
      if (scaling_ && !std::isfinite(s.grad_norm)) {
        // f16 overflow: normal operation. Drop the update, halve the scale.
        ++overflows;
        s.skipped = s.overflow = true;
        good_steps_ = 0;
        if (loss_scale_ / 2 < opts_.loss_scale_min) {
          std::ostringstream msg;
          msg << "step " << attempt << ": f16 gradients overflow (norm " << (std::isnan(s.grad_norm) ? "nan" : "inf")
              << ") at loss scale "
              << loss_scale_ << ", and halving it would go below loss_scale_min " << opts_.loss_scale_min
              << " (the loss " << loss << " is finite; the model's values outgrow f16)" << stop_note()
              << "; lower --lr, or train with --dtype bf16";
          throw NonFiniteError(msg.str(), attempt, loss_scale_);
        }
        loss_scale_ /= 2;
      } else {
        if (scaling_) {
          scale_grads(params, float(1.0 / loss_scale_));  // a power of two: exact
          s.grad_norm /= loss_scale_;
        }
        if (!std::isfinite(s.grad_norm)) {
          reject("gradient norm", s.grad_norm);
        } else {
          clip_grads_to(params, s.grad_norm, opts_.clip);
          optimizer_->step(lr);
          ++step_;
          in_row = 0;
          if (scaling_ && ++good_steps_ >= opts_.loss_scale_growth_interval) {
            loss_scale_ *= 2;
            good_steps_ = 0;
          }
        }
      }
    }
    if (const auto& off = model_->model->blocks->offload_hooks()) {
      off->check();  // a failed write: stop here, with the tensors it kept (nothing is lost)
      const OffloadStats os = off->stats();
      s.offloaded_bytes = (os.bytes_written + os.bytes_to_host) - (off0.bytes_written + off0.bytes_to_host);
      s.offload_stored_peak = os.stored_peak;
      s.offload_wait_ms = double(os.wait_ns - off0.wait_ns) * 1e-6;
    }
    if (const auto& comp = model_->model->blocks->compress_hooks())
      s.compressed_saved_bytes = comp->stats().compressed_bytes - comp0.compressed_bytes;
    s.recomputed_ops = checkpoint_counters().ops_recomputed - ops0;
    s.moved_bytes = dispatch_counters().bytes_moved - moved0.bytes_moved;
    s.replayed_comm_bytes = dispatch_counters().replay_bytes_moved - moved0.replay_bytes_moved;
    s.routing_metadata_saved_bytes = dispatch_counters().metadata_bytes_saved - moved0.metadata_bytes_saved;
    s.saved_bytes_peak = saved_bytes_report().peak_bytes;
    if (reducer_) {
      s.grad_buckets = reducer_->stats().buckets;
      s.grad_buckets_overlapped = reducer_->stats().started_in_backward;
    }
    const auto t1 = std::chrono::steady_clock::now();
    const auto stats = alloc.stats();
    s.step = attempt;
    s.total_steps = opts_.steps;
    s.loss = loss;
    s.lr = lr;
    s.skipped_steps = skipped;
    s.overflow_steps = overflows;
    s.step_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    s.tokens_per_s = double(c.batch * c.seq) / (s.step_ms * 1e-3);
    s.grad_accum = opts_.grad_accum;
    s.elapsed_s = std::chrono::duration<double>(t1 - t_start).count();
    s.eta_s = step_ > first ? s.elapsed_s / double(step_ - first) * double(opts_.steps - step_) : 0.0;
    s.peak_allocated_bytes = stats.allocated_peak;
    s.peak_reserved_bytes = stats.reserved_peak;
    // (A pipeline stage holds only its own parameters: the others' are released.)
    s.persistent_bytes =
        persistent_bytes(pipeline_ ? pipeline_->parameters() : model_->named_parameters(), *optimizer_);
    s.activation_bytes = s.peak_allocated_bytes - s.persistent_bytes;
    s.comm = layout_.counters() - comm0;
    if (pipeline_) {
      s.comm = s.comm + (pipeline_group_->counters() - pipeline_comm0);
      PipelineStageStats mine;
      mine.stage = pipeline_->stage();
      mine.first_block = pipeline_->bounds()[std::size_t(mine.stage)];
      mine.end_block = pipeline_->bounds()[std::size_t(mine.stage + 1)];
      mine.peak_allocated_bytes = s.peak_allocated_bytes;
      mine.activation_bytes = s.activation_bytes;
      mine.in_flight = pipeline_step.peak_in_flight;
      mine.forward_ms = pipeline_step.forward_ms;
      mine.backward_ms = pipeline_step.backward_ms;
      mine.idle_ms = pipeline_step.idle_ms;
      mine.sent_bytes = pipeline_step.sent_bytes;
      s.pipeline_stages = pipeline_->gather_stats(mine);
    }
    if (!s.skipped) {
      if ((opts_.eval_every > 0 && step_ % opts_.eval_every == 0) || step_ == stop) s.val_loss = evaluate();
      if (!opts_.save_dir.empty() && ((opts_.save_every > 0 && step_ % opts_.save_every == 0) || step_ == stop))
        save(opts_.save_dir);
    }
    if (on_step) on_step(s);
  }
}

std::vector<std::pair<std::string, Tensor>> Trainer::one_process_parameters() const {
  std::vector<std::pair<std::string, Tensor>> tensors =
      gather_experts(pipeline_ ? pipeline_->parameters() : model_->named_parameters());
  // Replica 0's pipeline gathers its stages to rank 0 (the other replicas hold the same).
  if (pipeline_ && layout_.world->rank() == 0)
    tensors = pipeline_->gather_to_first(std::move(tensors));
  return tensors;
}

std::vector<std::pair<std::string, Tensor>> Trainer::gather_experts(
    std::vector<std::pair<std::string, Tensor>> tensors) const {
  if (layout_.ep > 1) {
    // Gather every expert (and its optimizer state) from the expert-parallel
    // group: rank j holds local expert i as global expert j * per + i.
    const std::int64_t K = layout_.ep, per = opts_.config.experts / K;
    const std::int64_t first = layout_.ep_group->rank() * per;
    std::vector<std::pair<std::string, Tensor>> all;
    for (const auto& [name, t] : tensors) {
      const auto [at, e] = expert_index(name);
      if (at == std::string::npos) {
        all.emplace_back(name, t);
        continue;
      }
      Tensor gathered = layout_.ep_group->all_gather(t.contiguous());
      const std::int64_t rows = t.size(0);
      const std::string tail = name.substr(name.find('.', at));
      for (std::int64_t j = 0; j < K; ++j)
        all.emplace_back(name.substr(0, at) + std::to_string(j * per + (e - first)) + tail,
                         gathered.narrow(0, j * rows, rows).contiguous());
    }
    tensors = std::move(all);
  }
  return tensors;
}

void Trainer::save(const std::string& dir) const {
  std::vector<std::pair<std::string, Tensor>> tensors =
      pipeline_ ? pipeline_->parameters() : model_->named_parameters();
  for (auto& t : optimizer_->state()) tensors.push_back(t);
  tensors = gather_experts(std::move(tensors));
  if (pipeline_ && layout_.world->rank() == 0)  // replica 0's stages to rank 0
    tensors = pipeline_->gather_to_first(std::move(tensors));
  if (rank() == 0) {
    const RngState data = sampler_->state();
    const RngState dropout = default_generator(opts_.device).state();
    std::map<std::string, std::string> meta = {
        {"format", kFormat},
        {"step", std::to_string(step_)},
        {"seed", std::to_string(opts_.seed)},
        {"config", opts_.config.to_json().dump()},
        {"data", opts_.data_file.empty() ? "generated" : opts_.data_file},
        {"tokenizer", opts_.tokenizer},
        {"data_rng_seed", std::to_string(data.seed)},
        {"data_rng_offset", std::to_string(data.offset)},
        {"rng_seed", std::to_string(dropout.seed)},
        {"rng_offset", std::to_string(dropout.offset)},
        {"world_size", std::to_string(job_->size())},
        {"ep", std::to_string(layout_.ep)},
        // f16's dynamic loss scale (1 and 0 for f32/bf16), so a resumed run
        // continues with the same scale and growth count.
        {"loss_scale", format_exact(loss_scale_)},
        {"loss_scale_good_steps", std::to_string(good_steps_)},
    };
    // Every tensor checksummed; written crash-safely (train/state_files.h).
    save_state_files(dir, encode_safetensors(tensors, meta, {}, state_file(dir)));
  }
  job_->barrier();  // nobody reads the state before it is complete
}

void Trainer::resume(const std::string& dir) {
  resume_notes_.clear();
  StateChoice choice = choose_state_file(dir);
  const std::string cur = choice.path;
  // On a failure: what the previous state offers (read only then).
  auto prev_hint = [&]() -> std::string {
    const std::string prev = prev_state_file(dir);
    if (choice.from_prev) return "";
    struct stat st;
    if (::stat(prev.c_str(), &st) != 0) return " (there is no previous state " + prev + ")";
    try {
      const SafetensorsFile p = load_safetensors(prev);
      const auto step = p.metadata.find("step");
      return " (the previous state " + prev + " is intact: " +
             (step == p.metadata.end() ? "" : "step " + step->second + ", ") +
             (p.checksummed ? "every checksum matches" : "no checksums to verify") + "; move it to " +
             state_file(dir) + " to resume from it)";
    } catch (const IOError& e) {
      return std::string(" (the previous state is damaged too: ") + e.what() + ")";
    }
  };
  SafetensorsFile f;
  try {
    f = load_safetensors(cur);  // every checksum verified before any tensor is built
  } catch (const IOError& e) {
    throw IOError(std::string("--resume: ") + e.what() + prev_hint());
  }
  if (!f.checksummed)
    choice.notes.push_back(cur + " has no checksums (written before remat recorded them): loaded without an "
                           "integrity check; the next save adds them");
  auto meta = [&](const char* key) -> const std::string& {
    auto it = f.metadata.find(key);
    REMAT_CHECK(it != f.metadata.end(), IOError, "--resume: ", cur, " has no metadata '", key, "'", prev_hint());
    return it->second;
  };
  auto meta_u64 = [&](const char* key) {
    const std::string& v = meta(key);
    REMAT_CHECK(!v.empty() && v.find_first_not_of("0123456789") == std::string::npos, IOError,
                "--resume: metadata '", key, "' of ", cur, " is not a number: '", v, "'", prev_hint());
    return std::stoull(v);
  };
  REMAT_CHECK(meta("format") == kFormat, IOError, "--resume: ", cur, " has format '", meta("format"),
              "', expected ", kFormat);
  const ModelConfig saved = ModelConfig::from_json(Json::parse(meta("config"), cur + " config"));
  REMAT_CHECK(saved.to_json().dump() == opts_.config.to_json().dump(), IOError, "--resume: ", cur,
              " was trained with config ", saved.to_json().dump(), ", but this run uses ",
              opts_.config.to_json().dump());
  const std::int64_t step = std::int64_t(meta_u64("step"));
  // Validate every parameter before changing anything.
  for (const auto& [name, p] : model_->named_parameters()) {
    auto it = f.tensors.find(name);
    REMAT_CHECK(it != f.tensors.end(), IOError, "--resume: ", cur, " is missing parameter '", name, "'", prev_hint());
    REMAT_CHECK(it->second.sizes() == p.sizes() && it->second.dtype() == p.dtype(), IOError, "--resume: parameter '",
                name, "' in ", cur, " is ", shape_str(it->second.sizes()), " ", it->second.dtype(), ", expected ",
                shape_str(p.sizes()), " ", p.dtype());
  }
  const RngState data{meta_u64("data_rng_seed"), meta_u64("data_rng_offset")};
  const RngState rng{meta_u64("rng_seed"), meta_u64("rng_offset")};
  optimizer_->load_state(f.tensors, step);  // validates, then loads
  {
    NoGradGuard ng;
    for (auto& [name, p] : model_->named_parameters()) {
      if (p.released()) continue;  // another pipeline stage's
      Tensor dst = p;
      dst.copy_(f.tensors.at(name));
    }
  }
  double scale = 1;
  std::int64_t good_steps = 0;
  if (f.metadata.count("loss_scale")) {
    const std::string& v = meta("loss_scale");
    char* end = nullptr;
    scale = std::strtod(v.c_str(), &end);
    REMAT_CHECK(!v.empty() && end && *end == '\0' && std::isfinite(scale) && scale > 0, IOError,
                "--resume: metadata 'loss_scale' of ", cur, " is not a finite number > 0: '", v, "'", prev_hint());
    good_steps = std::int64_t(meta_u64("loss_scale_good_steps"));
  } else if (scaling_) {
    choice.notes.push_back(cur + " has no loss scale (written before f16 loss scaling): starting from " +
                           format_exact(opts_.loss_scale_init));
    scale = opts_.loss_scale_init;
  }
  sampler_->set_state(data);
  default_generator(opts_.device).set_state(rng);
  if (scaling_) set_loss_scale(scale, good_steps);
  step_ = step;
  resume_notes_ = std::move(choice.notes);
}

std::unique_ptr<DecoderModel> load_trained_model(const std::string& dir, std::map<std::string, std::string>* metadata) {
  const StateChoice choice = choose_state_file(dir);
  const SafetensorsFile f = load_safetensors(choice.path);  // checksums verified
  auto it = f.metadata.find("format");
  REMAT_CHECK(it != f.metadata.end() && it->second == kFormat, IOError, choice.path,
              " is not a remat training state (metadata format '", it == f.metadata.end() ? "" : it->second,
              "', expected ", kFormat, ")");
  auto cfg = f.metadata.find("config");
  REMAT_CHECK(cfg != f.metadata.end(), IOError, choice.path, " has no metadata 'config'");
  const ModelConfig c = ModelConfig::from_json(Json::parse(cfg->second, choice.path + " config"));
  std::unique_ptr<DecoderModel> model;
  {
    SkipWeightInit loaded_next;  // every parameter is read below (or this throws)
    model = std::make_unique<DecoderModel>(c, 0);
  }
  NoGradGuard ng;
  for (auto& [name, p] : model->named_parameters()) {
    auto t = f.tensors.find(name);
    REMAT_CHECK(t != f.tensors.end(), IOError, choice.path, " is missing parameter '", name, "'");
    REMAT_CHECK(t->second.sizes() == p.sizes() && t->second.dtype() == p.dtype(), IOError, "parameter '", name,
                "' in ", choice.path, " is ", shape_str(t->second.sizes()), " ", t->second.dtype(), ", expected ",
                shape_str(p.sizes()), " ", p.dtype());
    Tensor dst = p;
    dst.copy_(t->second);
  }
  model->train(false);
  if (metadata) *metadata = f.metadata;
  return model;
}

}  // namespace remat
