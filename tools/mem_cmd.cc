// ./remat mem: the allocator's history over one training step, written as
// JSON and as an HTML picture (tools/mem_timeline.h).
#include <cmath>
#include <cstdio>
#include <map>
#include <fstream>
#include <memory>

#include "checkpoint/checkpoint.h"
#include "checkpoint/time_estimate.h"
#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/meta_mirror.h"
#include "engine/op_hooks.h"
#include "engine/parallel_for.h"
#include "engine/recompute_context.h"
#include "models/decoder.h"
#include "models/recompute.h"
#include "models/tensor_parallel.h"
#include "parallel/simulated_group.h"
#include "tools/args.h"
#include "tools/fine_tune_flags.h"
#include "tools/auto_plan_flags.h"
#include "tools/commands.h"
#include "tools/mem_timeline.h"
#include "train/comm_estimate.h"
#include "train/data.h"
#include "train/hf_model.h"
#include "train/optimizer.h"
#include "train/parallel_layout.h"
#include "train/pipeline.h"
#include "train/trainer.h"
#include "train/zero.h"

namespace remat::tools {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Watches every op of the recorded step: marks replay phases in the
// allocator history (an op running in a replay after one that did not starts
// "replay"; the first op after a replay resumes the phase that was running),
// and snapshots the bytes held for backward whenever the allocator's peak
// has grown since the last op boundary.
class StepWatcher final : public OpHook {
 public:
  explicit StepWatcher(CachingAllocator& alloc) : alloc_(alloc), best_peak_(alloc.stats().allocated_peak) {}

  // Starts phase `name` (forward, backward, optimizer, ...).
  void phase(const std::string& name) {
    check_peak();
    phase_ = name;
    alloc_.mark(name);
  }

  std::optional<std::vector<Tensor>> before(const OpCall&) override {
    check_peak();
    const bool replaying = in_recompute();
    if (replaying != replaying_) {
      replaying_ = replaying;
      alloc_.mark(replaying ? "replay" : phase_);
    }
    return std::nullopt;
  }

  void after(const OpCall&, const std::vector<Tensor>&) override { check_peak(); }

  void check_peak() {
    const std::int64_t peak = alloc_.stats().allocated_peak;
    if (peak <= best_peak_ && have_snapshot_) return;
    best_peak_ = peak;
    have_snapshot_ = true;
    snapshot_ = saved_bytes_report();
  }

  const SavedBytesReport& saved_at_peak() const { return snapshot_; }

 private:
  CachingAllocator& alloc_;
  std::string phase_;
  bool replaying_ = false;
  std::int64_t best_peak_;
  bool have_snapshot_ = false;
  SavedBytesReport snapshot_;
};

// Records, for each block's first forward of the step (not its replays),
// the bytes held for backward that the forward added from the end of the
// block before (block 0: from the step's start, so the embedding's saves
// count there) to its own end: its saves, or under a block region its
// boundary, whose hold comes before the block runs.
class BlockSaves final : public BlockObserver {
 public:
  explicit BlockSaves(std::size_t blocks) : bytes_(blocks, 0), done_(blocks, false), last_(saved_bytes_live()) {}
  void before_block(std::int64_t, const Tensor&) override {}
  void after_block(std::int64_t i, const Tensor&) override {
    if (in_recompute() || done_[std::size_t(i)]) return;
    const std::int64_t now = saved_bytes_live();
    bytes_[std::size_t(i)] = now - last_;
    last_ = now;
    done_[std::size_t(i)] = true;
  }
  const std::vector<std::int64_t>& bytes() const { return bytes_; }

 private:
  std::vector<std::int64_t> bytes_;
  std::vector<bool> done_;
  std::int64_t last_;
};

// The command's own flags, checked once.
struct MemOptions {
  std::string stem;  // --out without a trailing .json or .html
  std::int64_t steps_before = 0, capacity = 0;
  std::uint64_t seed = 0;
  Device device = kCPU;  // cpu, cuda, or meta: the same step on shapes alone (docs/META.md)
  std::string dtype = "f32";  // the compute dtype (parameters, gradients and optimizer state stay f32)
  std::string device_model = "cpu-measured";  // for the time estimate (checkpoint/time_estimate.h)
  std::optional<SimulatedRank> sim;  // --simulate-world: one rank of this job, on meta
};

std::vector<FlagSpec> mem_flag_specs() {
  auto specs = with_auto_plan_flags(
      {text_flag("config", "model config: tiny, tiny-moe, bench-dense, bench-moe or FILE.json", "tiny"),
       text_flag("model", "a Hugging Face model folder instead of --config: its architecture, and its weights "
                 "(on meta: their shapes and dtypes; a frozen parameter keeps the folder's bf16 / f16)"),
       fine_tune_flag_specs()[0], fine_tune_flag_specs()[1],
       text_flag("recompute", "recompute plan, as for train", "none"),
       text_flag("device", "cpu, cuda, or meta: the step on shapes alone, its allocations exactly the CPU's (or a "
                 "GPU's, with --meta-kernels cuda)", "cpu"),
       meta_kernels_flag_spec(),
       text_flag("dtype", "compute dtype: f32 or bf16 (parameters, gradients and optimizer state stay f32)", "f32"),
       int_flag("batch", "sequences per step over all ranks (default: the config's; with --simulate-world, the "
                "config's per micro-batch per data-parallel rank)", std::nullopt, {.min = 1}),
       int_flag("grad-accum", "micro-batches per step (default 1; under pp, the pipeline's stages)", std::nullopt,
                {.min = 1}),
       text_flag("pp-schedule", "pipeline schedule under pp: 1f1b or gpipe", "1f1b"),
       int_flag("seq", "tokens per sequence (default: the config's)", std::nullopt, {.min = 1}),
       text_flag("offload-dir", "directory for the offload plans' spill file (default: $TMPDIR or /tmp)"),
       int_flag("seed", "seed for weights, data and dropout", 0, {.min = 0}),
       int_flag("steps-before", "training steps run before the recorded one, so optimizer state exists", 1,
                {.min = 0}),
       text_flag("out", "write FILE.json and FILE.html (a trailing .json or .html is dropped) (required)"),
       int_flag("capacity", "allocator history capacity in events", std::int64_t(1) << 20, {.min = 1}),
       threads_flag_spec()});
  for (auto& s : simulate_flag_specs()) specs.push_back(std::move(s));
  return specs;
}

MemOptions mem_options(const Flags& f) {
  REMAT_CHECK(f.has("out"), Error, "--out FILE is required (writes FILE.json and FILE.html)");
  MemOptions m;
  m.stem = f.get("out");
  if (ends_with(m.stem, ".html"))
    m.stem.resize(m.stem.size() - 5);
  else if (ends_with(m.stem, ".json"))
    m.stem.resize(m.stem.size() - 5);
  REMAT_CHECK(!m.stem.empty() && !ends_with(m.stem, "/"), Error, "--out '", f.get("out"),
              "' names no file (expected e.g. --out out/tiny-mem)");
  m.steps_before = f.get_int("steps-before");
  m.device = device_flag(f, true);
  m.dtype = f.get("dtype");
  m.device_model = f.get("device-model");
  check_device_model(m.device_model);
  REMAT_CHECK(m.dtype == "f32" || m.dtype == "bf16", Error, "mem: --dtype ", m.dtype,
              ": expected f32 or bf16 (f16 trains with a loss scaler; use train)");
  m.capacity = f.get_int("capacity");
  m.sim = simulated_rank_flags(f, m.device);
  apply_threads_flag(f);
  m.seed = std::uint64_t(f.get_int("seed"));
  return m;
}

// The trainer's options for the recorded run (the plan resolved: auto is
// profiled and chosen here).
TrainOptions mem_train_options(const Flags& f, const MemOptions& m) {
  TrainOptions o;
  REMAT_CHECK(!f.has("model") || !f.has("config"), Error, "mem: --model DIR brings its own config; drop --config");
  o.config = f.has("model") ? load_hf_config(f.get("model")).config : ModelConfig::load(f.get("config"));
  o.init_model = f.get("model");
  apply_fine_tune_flags(f, o.config);
  const WorldSpec w = m.sim ? m.sim->world : WorldSpec{};
  o.pp = w.pp;
  o.ep = w.ep;
  o.zero = w.zero;
  o.tp = w.tp;
  o.sp = w.sp;
  o.grad_accum = f.has("grad-accum") ? f.get_int("grad-accum") : w.pp;
  o.pp_schedule = parse_pipeline_schedule(f.get("pp-schedule"));
  if (f.has("batch"))
    o.config.batch = f.get_int("batch");
  else if (m.sim)
    scale_simulated_batch(o.config, *m.sim, o.grad_accum);
  REMAT_CHECK(o.config.batch % (w.dp * o.grad_accum) == 0, Error, "mem: --batch ", o.config.batch,
              " sequences do not divide into ", w.dp, " data-parallel rank(s) x ", o.grad_accum, " micro-batches");
  if (f.has("seq")) o.config.seq = f.get_int("seq");
  o.config.validate();
  o.seed = m.seed;
  o.device = m.device;
  o.dtype = compute_dtype_from_name(m.dtype);
  o.recompute = resolve_recompute(f, f.get("recompute"), o.config, m.dtype, m.device, m.seed);
  return o;
}

// FILE.json and FILE.html, opened first (a bad path should not cost a
// training step); whatever fails before keep() leaves no half-written
// outputs behind.
class MemOutputs {
 public:
  explicit MemOutputs(const std::string& stem)
      : json_path_(stem + ".json"), html_path_(stem + ".html"), json_(json_path_), html_(html_path_) {
    REMAT_CHECK(json_.good(), IOError, "--out: cannot write ", json_path_);
    REMAT_CHECK(html_.good(), IOError, "--out: cannot write ", html_path_);
  }
  ~MemOutputs() {
    if (!kept_) {
      std::remove(json_path_.c_str());
      std::remove(html_path_.c_str());
    }
  }
  MemOutputs(const MemOutputs&) = delete;
  MemOutputs& operator=(const MemOutputs&) = delete;

  // Writes both files and keeps them. IOError if a write fails.
  void write_and_keep(const std::string& json, const std::string& html) {
    json_ << json;
    html_ << html;
    json_.close();
    html_.close();
    REMAT_CHECK(json_.good(), IOError, "writing ", json_path_, " failed");
    REMAT_CHECK(html_.good(), IOError, "writing ", html_path_, " failed");
    kept_ = true;
  }
  const std::string& json_path() const { return json_path_; }
  const std::string& html_path() const { return html_path_; }

 private:
  std::string json_path_, html_path_;
  std::ofstream json_, html_;
  bool kept_ = false;
};

// The run the trainer would do (train/trainer.cc), step by step here so the
// phases can be marked: same corpus, model, plan, AdamW, schedule and clip;
// on `job` (one process, or a simulated rank), with its data-, expert- and
// pipeline-parallel groups, gradient reducer and micro-batches.
class MemTrainer {
 public:
  MemTrainer(const TrainOptions& o, const RecomputePlan& plan, std::shared_ptr<ProcessGroup> job)
      : o_(o), alloc_(allocator_for(o.device)) {
    const ModelConfig& c = o.config;
    TensorParallelJob split = split_tensor_parallel(std::move(job), c, o.tp, o.sp);  // (tp innermost)
    tp_ = std::move(split.tp);
    const JobGroups groups = split_job_groups(split.rest, o.pp, 0, c);
    layout_ = make_parallel_layout(groups.world, o.ep, c);
    manual_seed(o.seed);
    {
      // On meta the model is built there: its parameters take no memory. On
      // a GPU it is built on the CPU and moved, as the trainer does.
      DefaultDeviceScope on(o.device.is_meta() ? kMeta : kCPU);
      std::optional<SkipWeightInit> loaded_next;  // (--model: every weight is read below)
      if (!o.init_model.empty()) loaded_next.emplace();
      model_ = std::make_unique<DecoderModel>(c, o.seed, layout_.placement());
    }
    if (!o.init_model.empty()) load_hf_weights(*model_, o.init_model);
    if (o.device.is_cuda()) model_->to(o.device);
    apply_parallel_layout(*model_, layout_, o.reuse_routing_metadata);
    if (tp_) apply_tensor_parallel(*model_, tp_);
    model_->set_compute_dtype(o.dtype);
    apply_recompute_plan(*model_, plan);
    pipeline_group_ = groups.pipeline;
    if (groups.pipeline)
      pipeline_ = std::make_unique<PipelineStage>(*model_, groups.pipeline, balanced_stages(*model_, o.pp),
                                                  o.pp_schedule);
    std::vector<std::pair<std::string, Tensor>> params;  // (the ones that train)
    for (const auto& [name, p] : pipeline_ ? pipeline_->parameters() : model_->named_parameters()) {
      if (p.requires_grad())
        params.emplace_back(name, p);
      else
        frozen_bytes_ += std::int64_t(p.nbytes()), frozen_ += p.numel();
    }
    for (const auto& [name, p] : params) owned_.push_back(p);
    AdamWOptions ao;
    ao.weight_decay = o.weight_decay;
    DataParallelUpdate update = make_data_parallel_update(layout_, params, o.bucket_bytes, o.zero, ao,
                                                          *model_);
    reducer_ = std::move(update.reducer);
    optimizer_ = std::move(update.adamw);
    zero_ = std::move(update.zero);
    if (!o.device.is_meta()) {
      corpus_ = generated_corpus(o.seed);
      sampler_ = std::make_unique<BatchSampler>(corpus_.train, c.batch, c.seq, o.seed + 1);
    }
    model_->train(true);
  }

  // This rank's share of the next batch: the sampler's, or on meta a batch
  // of its shape (no tokens).
  Tensor next_batch() {
    Tensor global = sampler_ ? sampler_->next()
                             : empty({o_.config.batch, o_.config.seq + 1}, TensorOptions(DType::i64, o_.device));
    return batch_shard(global, *layout_.world).to(o_.device);
  }

  // One training step as Trainer::run does it; `w` (when recording) marks
  // the phases. Returns the loss (the last micro-batch's, this rank's).
  double step(StepWatcher* w) {
    auto phase = [&](const char* name) {
      if (w) w->phase(name);
    };
    const double lr = cosine_lr(step_, o_.warmup, o_.steps, o_.lr, o_.min_lr);
    phase("zero_grad");
    Tensor batch = next_batch();
    model_->zero_grad();
    ShardedGradReducer* sharded = zero_ ? zero_->grad_reducer() : nullptr;  // --zero 2/3
    if (sharded) sharded->zero();
    double loss = std::nan("");  // meta has no values
    const std::int64_t M = o_.grad_accum;
    const double seed = 1.0 / double(layout_.world->size() * M);
    {
      CategoryScope cat(MemoryCategory::activation);
      const DynamicRematScope dynamic(model_->block_stack().dynamic_remat());  // --recompute dynamic
      phase("forward");
      if (pipeline_) {
        std::function<void()> arm;
        if (reducer_ || sharded) arm = [this, sharded] {
          if (reducer_) reducer_->prepare();
          if (sharded) sharded->prepare();
        };
        const auto r = pipeline_->step(batch, M, seed, arm);
        if (!o_.device.is_meta()) loss = r.loss.back();
      } else {
        Generator& gen = default_generator(o_.device);
        const RngState streams = gen.state();
        const std::int64_t rows = batch.size(0) / M;
        for (std::int64_t m = 0; m < M; ++m) {
          RngStreamScope keyed(gen, streams, m, o_.config.n_layers);
          if (m > 0) phase("forward");
          auto out = model_->forward_loss(M == 1 ? batch : batch.narrow(0, m * rows, rows));
          if (!o_.device.is_meta()) loss = out.loss.item();
          phase("backward");
          if (reducer_ && m == M - 1) reducer_->prepare();
          if (sharded) sharded->prepare();
          out.loss.backward(seed != 1.0 ? full({}, seed, TensorOptions(out.loss.dtype(), out.loss.device())) : Tensor());
          if (sharded) sharded->finish();
        }
        gen.set_state(rng_streams_end(streams, M, o_.config.n_layers));
      }
      if (reducer_) reducer_->finish();
      if (sharded) sharded->finish();
      if (zero_ && zero_->gatherer()) zero_->gatherer()->release_all();
    }
    phase("optimizer");
    if (zero_) {
      update_sharded(lr);
    } else {
      clip_grad_norm(owned_, o_.clip);
      optimizer_->step(lr);
    }
    ++step_;
    if (w) w->check_peak();
    alloc_.mark("end");
    return loss;
  }

  DecoderModel& model() { return *model_; }
  CachingAllocator& alloc() { return alloc_; }
  // What this rank keeps across steps: parameters, gradients, optimizer state.
  std::int64_t persistent_bytes() const {
    if (zero_) return zero_->persistent_bytes();
    std::vector<std::pair<std::string, Tensor>> named;
    for (const Tensor& p : owned_) named.emplace_back("", p);
    return remat::persistent_bytes(named, *optimizer_) + frozen_bytes_;
  }
  // ZeRO's working set at a block's backward (ZeroOptimizer::working_bytes).
  std::int64_t working_bytes() const { return zero_ ? zero_->working_bytes() : 0; }
  const PipelineStage* pipeline() const { return pipeline_.get(); }
  const ParallelLayout& layout() const { return layout_; }
  const std::shared_ptr<TensorParallel>& tensor_parallel() const { return tp_; }
  // Every group this rank communicates on (the layout's, the pipeline's and
  // the tensor-parallel ones).
  std::vector<std::shared_ptr<ProcessGroup>> groups() const {
    auto g = layout_.groups();
    if (pipeline_group_) g.push_back(pipeline_group_);
    if (tp_) g.push_back(tp_->group);
    if (tp_ && tp_->kv_group) g.push_back(tp_->kv_group);
    return g;
  }
  // The parameters this rank holds and updates (a stage's own; under
  // --zero 3 its shards of them).
  // The frozen parameters this rank holds (--lora, --freeze).
  std::int64_t frozen_parameters() const { return frozen_; }
  std::int64_t owned_parameters() const {
    if (zero_) return zero_->held_parameters();
    std::int64_t n = 0;
    for (const Tensor& p : owned_) n += p.numel();
    return n;
  }

 private:
  const TrainOptions& o_;
  Corpus corpus_;
  CachingAllocator& alloc_;
  ParallelLayout layout_;
  std::unique_ptr<DecoderModel> model_;
  std::unique_ptr<PipelineStage> pipeline_;
  std::shared_ptr<TensorParallel> tp_;  // --simulate-world tp=T (null without)
  std::shared_ptr<ProcessGroup> pipeline_group_;
  std::vector<Tensor> owned_;  // the parameters this rank updates
  std::int64_t frozen_bytes_ = 0, frozen_ = 0;  // and the frozen ones it holds (--lora, --freeze)
  // The trainer's update under --zero (Trainer::update_tensors): the whole
  // gradients a backward did not reach become zeros, the shard pieces bound,
  // clipped, stepped. (The norm is this rank's: the values are not compared.)
  void update_sharded(double lr) {
    std::vector<Tensor> whole = zero_->stage() >= 2 ? zero_->unsharded() : owned_;
    give_gradient_buffers(whole);
    clip_grad_norm(zero_->bind_grads(), o_.clip);
    zero_->step(lr);
  }

  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<ZeroOptimizer> zero_;
  std::unique_ptr<BatchSampler> sampler_;
  std::int64_t step_ = 0;
};

// The offload and compression figures over all steps, when the plan has them.
void add_hook_info(const DecoderModel& model, MemRecording& rec) {
  if (const auto& off = model.block_stack().offload_hooks()) {
    off->check();
    rec.info.emplace_back("offloaded to the spill file (all steps)", format_bytes(off->stats().bytes_written));
    rec.info.emplace_back("offload wait (all steps)", std::to_string(double(off->stats().wait_ns) * 1e-6) + " ms");
  }
  if (const auto& comp = model.block_stack().compress_hooks())
    rec.info.emplace_back("compressed saves (all steps)", format_bytes(comp->stats().compressed_bytes) + " (from " +
                                                  format_bytes(comp->stats().original_bytes) + ")");
}

// What a simulated rank runs: its stage's blocks, its replica, its experts.
std::string rank_role(MemTrainer& run) {
  std::string role;
  if (const PipelineStage* st = run.pipeline())
    role = "stage " + std::to_string(st->stage()) + " (blocks " + std::to_string(st->bounds()[std::size_t(st->stage())]) +
           "-" + std::to_string(st->bounds()[std::size_t(st->stage()) + 1] - 1) + ")";
  const auto& l = run.layout();
  role += std::string(role.empty() ? "" : ", ") + "data-parallel rank " + std::to_string(l.world->rank()) + " of " +
          std::to_string(l.world->size());
  if (l.ep > 1) role += ", expert-parallel rank " + std::to_string(l.ep_group->rank()) + " of " + std::to_string(l.ep);
  if (const auto& tp = run.tensor_parallel())
    role += ", tensor-parallel rank " + std::to_string(tp->rank()) + " of " + std::to_string(tp->size()) +
            (tp->sp ? " (sequence parallel)" : "");
  return role;
}

// The info key of the step's time estimate (labelled an estimate, with its device model).
std::string estimate_key(const MemOptions& m) { return "estimated step time (" + m.device_model + ", an estimate)"; }

// The line about the peak, the peak by category, the blocks' bytes, the
// estimate and the files written.
void print_summary(const MemRecording& rec, const Timeline& t, const MemOutputs& out, const MemOptions& m) {
  const TimelinePoint& peak = t.points.at(t.peak_point);
  std::int64_t replays = 0;
  for (const auto& ph : t.phases) replays += ph.name == "replay";
  std::int64_t loss_most = 0;  // the loss region's own peak (its logits and their gradient)
  for (const TimelinePoint& p : t.points) loss_most = std::max(loss_most, p.bytes[std::size_t(MemoryCategory::loss)]);
  std::printf("mem: %s, recompute %s: peak allocated %s at %.2f ms (%s%s%s; loss %s of it, %s at most), reserved "
              "peak %s, %zu events, %lld replay phases\n",
              rec.config.c_str(), rec.plan.c_str(), format_bytes(peak.allocated).c_str(), double(peak.t_ns) / 1e6,
              t.peak_phase.c_str(), t.peak_tag.empty() ? "" : ", op ", t.peak_tag.c_str(),
              format_bytes(peak.bytes[std::size_t(MemoryCategory::loss)]).c_str(), format_bytes(loss_most).c_str(),
              format_bytes(t.reserved_peak).c_str(), rec.events.size(), static_cast<long long>(replays));
  std::string cats;  // the peak by category (they add up to the peak)
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c)
    if (peak.bytes[c] > 0)
      cats += std::string(cats.empty() ? "" : ", ") + category_name(MemoryCategory(c)) + " " + format_bytes(peak.bytes[c]);
  std::printf("  at the peak: %s\n", cats.c_str());
  // Per block: each one's bytes when there are few, else the range.
  const std::vector<std::int64_t> b(rec.block_saved_bytes.begin() + rec.first_block,
                                    rec.block_saved_bytes.begin() + rec.end_block);
  if (!b.empty()) {
    std::string per;
    if (b.size() <= 8) {
      for (std::size_t i = 0; i < b.size(); ++i) per += std::string(i ? ", " : "") + format_bytes(b[i]);
    } else {
      const auto [lo, hi] = std::minmax_element(b.begin(), b.end());
      std::int64_t total = 0;
      for (auto x : b) total += x;
      per = format_bytes(*lo) + " (block " + std::to_string(rec.first_block + (lo - b.begin())) + ") to " +
            format_bytes(*hi) + " (block " + std::to_string(rec.first_block + (hi - b.begin())) + "), " +
            format_bytes(total) + " over " + std::to_string(b.size()) + " blocks";
    }
    std::printf("  held for backward per block (after its forward): %s\n", per.c_str());
  }
  for (const auto& [k, v] : rec.info)
    if (k == estimate_key(m) || k == "simulated rank" || k == "communication (this rank)")
      std::printf("  %s: %s\n", k.c_str(), v.c_str());
  std::printf("  wrote %s and %s\n", out.json_path().c_str(), out.html_path().c_str());
}

// --simulate-world ...,zero=3: the peak next to its arithmetic (issue #37):
// 16 bytes per parameter over the D ranks (f32 shards of the values, the
// gradients and AdamW's two moments), the gathered units at the peak (the
// unit that runs and the next one prefetched, in the gathered dtype: the
// compute dtype under --dtype bf16, and the running unit's flat f32
// gradient before its reduce-scatter: ZeroOptimizer::working_bytes), and
// the activations (the peak's activation, recompute, loss and other bytes,
// and backward's gradients of activations: the gradient bytes at the peak
// beyond the shards' 4 x params / D and the unit's flat gradient).
void print_zero3_arithmetic(MemTrainer& run, const TimelinePoint& peak, std::int64_t dp) {
  const std::int64_t working = run.working_bytes();
  const std::int64_t persistent = 16 * run.model().num_parameters() / dp;
  std::map<std::string, std::int64_t> unit_bytes;
  for (const auto& [name, p] : run.model().named_parameters())
    unit_bytes[shard_unit_name(name)] += p.numel() * std::int64_t(sizeof(float));
  std::int64_t flat_gradient = 0;  // a block's (the peak is in a block's backward)
  for (const auto& [unit, b] : unit_bytes)
    if (unit.rfind("block.", 0) == 0) flat_gradient = std::max(flat_gradient, b);
  std::int64_t acts = std::max<std::int64_t>(0, peak.bytes[std::size_t(MemoryCategory::gradient)] -
                                                    4 * run.model().num_parameters() / dp - flat_gradient);
  for (MemoryCategory c : {MemoryCategory::activation, MemoryCategory::recompute, MemoryCategory::loss,
                           MemoryCategory::other})
    acts += peak.bytes[std::size_t(c)];
  const std::int64_t sum = persistent + working + acts;
  std::printf("  zero 3 arithmetic (this rank): 16 x %lld parameters / %lld = %s, + ZeRO's working set (a unit and "
              "the one prefetched gathered, its f32 gradient) %s, + activations and their gradients at the peak %s = %s; measured peak %s "
              "(%+.1f%%)\n",
              static_cast<long long>(run.model().num_parameters()), static_cast<long long>(dp),
              format_bytes(persistent).c_str(), format_bytes(working).c_str(), format_bytes(acts).c_str(),
              format_bytes(sum).c_str(), format_bytes(peak.allocated).c_str(),
              100.0 * double(peak.allocated - sum) / double(sum));
}

// One step with `watcher` and `estimator` observing it; the estimate gets
// the step's offload transfers, AdamW over this rank's parameters and the
// groups' communication (*comm_bytes: what this rank sent). Returns the loss.
double estimated_step(MemTrainer& run, const std::shared_ptr<StepWatcher>& watcher, StepTimeEstimator& estimator,
                      std::int64_t* comm_bytes) {
  OpHookScope scope(watcher);
  OpHookScope estimate(std::shared_ptr<OpHook>(&estimator, [](OpHook*) {}));
  const auto& off = run.model().block_stack().offload_hooks();
  const std::int64_t moved0 = off ? off->stats().moved_bytes() : 0;
  const auto groups = run.groups();
  std::vector<CommCounters> comm0;
  for (const auto& g : groups) comm0.push_back(g->counters());
  const double loss = run.step(watcher.get());
  if (off) estimator.add_transfer(off->stats().moved_bytes() - moved0);
  estimator.add_optimizer(run.owned_parameters());
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const CommCounters d = groups[i]->counters() - comm0[i];
    estimator.add_comm(comm_seconds(*groups[i], d, estimator.model()));
    for (CommPhase p : {CommPhase::forward, CommPhase::backward, CommPhase::replay}) *comm_bytes += d.bytes_in(p);
  }
  return loss;
}

// One step recorded: the allocator history (at most `capacity` events) from
// the bytes held before it, what was held for backward at the peak, and the
// facts the page shows. *allocated_peak: the allocator's own peak over it.
MemRecording record_step(MemTrainer& run, const TrainOptions& o, const MemOptions& m, std::int64_t* allocated_peak) {
  CachingAllocator& alloc = run.alloc();
  // First: measuring the cpu-measured model allocates (before the peak reset).
  auto estimator = std::make_shared<StepTimeEstimator>(device_model(m.device_model));
  MemRecording rec;
  rec.config = o.config.name;
  rec.plan = o.recompute;
  alloc.reset_peak();
  reset_saved_bytes_peak();
  reset_checkpoint_counters();
  const MemoryStats before = alloc.stats();
  rec.initial_bytes = before.category_bytes;
  rec.initial_reserved = before.reserved_bytes;
  auto watcher = std::make_shared<StepWatcher>(alloc);
  auto blocks = std::make_shared<BlockSaves>(std::size_t(o.config.n_layers));
  run.model().model->blocks->set_observer(blocks);
  double loss = 0;
  std::int64_t comm_bytes = 0;  // sent by this rank over the step (received, for receives)
  alloc.enable_history(std::size_t(m.capacity));
  try {
    loss = estimated_step(run, watcher, *estimator, &comm_bytes);
  } catch (...) {
    alloc.enable_history(0);
    throw;
  }
  rec.events = alloc.history();
  alloc.enable_history(0);
  run.model().model->blocks->set_observer(nullptr);
  rec.block_saved_bytes = blocks->bytes();
  rec.end_block = std::int64_t(rec.block_saved_bytes.size());
  if (const PipelineStage* st = run.pipeline()) {
    rec.first_block = st->bounds()[std::size_t(st->stage())];
    rec.end_block = st->bounds()[std::size_t(st->stage()) + 1];
  }
  *allocated_peak = alloc.stats().allocated_peak;
  const CheckpointCounters cc = checkpoint_counters();
  REMAT_CHECK(std::int64_t(rec.events.size()) < m.capacity || rec.events.empty() || rec.events.front().seq == 0,
              Error, "the step made more than --capacity ", m.capacity,
              " allocator events and the oldest were lost; run again with a larger --capacity");
  rec.saved_at_peak_by_op = watcher->saved_at_peak().bytes_by_op;
  rec.saved_at_peak_total = watcher->saved_at_peak().live_bytes;
  rec.info = {{"seed", std::to_string(m.seed)},
              {"steps before", std::to_string(m.steps_before)},
              {"device", o.device.is_meta() && meta_kernels() == DeviceType::CUDA ? "meta (CUDA's kernels)"
                                                                                  : o.device.str()},
              {"loss", o.device.is_meta() ? std::string("- (meta: shapes only)") : std::to_string(loss)},
              {"parameters", std::to_string(whole_parameters(run.model()))},
              {"parameters held (this rank)", std::to_string(run.owned_parameters())},
              {"persistent (this rank)", format_bytes(run.persistent_bytes())},
              {"replays", std::to_string(cc.replays)},
              {"recomputed ops", std::to_string(cc.ops_recomputed)},
              {"saved-bytes peak", format_bytes(saved_bytes_report().peak_bytes)},
              {"threads", std::to_string(num_threads())}};
  if (run.frozen_parameters() > 0)
    rec.info.emplace_back("frozen parameters (this rank; not in the held ones)", std::to_string(run.frozen_parameters()));
  if (m.sim) {
    rec.info.emplace_back("simulated rank", std::to_string(m.sim->rank) + " of " + m.sim->world.str() + ": " +
                                                rank_role(run));
    rec.info.emplace_back("communication (this rank)", format_bytes(comm_bytes));
  }
  add_hook_info(run.model(), rec);
  const StepEstimate& e = estimator->estimate();
  rec.info.emplace_back(estimate_key(m), std::to_string(e.total() * 1e3) + " ms (forward " +
                                             std::to_string(e.forward * 1e3) + ", backward " +
                                             std::to_string(e.backward * 1e3) + ", replay " +
                                             std::to_string(e.replay * 1e3) + ", optimizer " +
                                             std::to_string(e.optimizer * 1e3) + ", offload " +
                                             std::to_string(e.offload * 1e3) + ", communication " +
                                             std::to_string(e.comm * 1e3) + ")");
  return rec;
}

}  // namespace

int run_mem(const std::vector<std::string>& args) {
  Flags f("mem", "the allocator history over one training step as JSON and HTML", args, mem_flag_specs());
  const MemOptions m = mem_options(f);
  const TrainOptions o = mem_train_options(f, m);
  RecomputePlan plan = RecomputePlan::parse(o.recompute, o.config.n_layers);
  if (f.has("offload-dir")) plan.offload_dir = f.get("offload-dir");
  MemOutputs out(m.stem);

  MemTrainer run(o, plan, m.sim ? simulated_world(int(m.sim->world.ranks()), m.sim->rank) : single_process_group());
  for (std::int64_t i = 0; i < m.steps_before; ++i) run.step(nullptr);
  std::int64_t allocated_peak = 0;
  const MemRecording rec = record_step(run, o, m, &allocated_peak);

  const Timeline t = build_timeline(rec);
  const TimelinePoint& peak = t.points.at(t.peak_point);
  REMAT_CHECK(peak.allocated == allocated_peak, Error, "the recorded events peak at ", peak.allocated,
              " bytes but the allocator's peak over the step is ", allocated_peak);
  out.write_and_keep(timeline_json(rec, t), timeline_html(rec, t));
  print_summary(rec, t, out, m);
  if (m.sim && m.sim->world.zero == 3) print_zero3_arithmetic(run, peak, m.sim->world.dp);
  return 0;
}

}  // namespace remat::tools
