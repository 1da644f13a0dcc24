// ./remat mem: the allocator's history over one training step, written as
// JSON and as an HTML picture (tools/mem_timeline.h).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>

#include "checkpoint/checkpoint.h"
#include "checkpoint/time_estimate.h"
#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/op_hooks.h"
#include "engine/parallel_for.h"
#include "engine/recompute_context.h"
#include "models/decoder.h"
#include "models/recompute.h"
#include "tools/args.h"
#include "tools/auto_plan_flags.h"
#include "tools/commands.h"
#include "tools/mem_timeline.h"
#include "train/data.h"
#include "train/optimizer.h"
#include "train/trainer.h"

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
  Device device = kCPU;  // cpu, or meta: the same step on shapes alone (docs/META.md)
  std::string dtype = "f32";  // the compute dtype (parameters, gradients and optimizer state stay f32)
  std::string device_model = "cpu-measured";  // for the time estimate (checkpoint/time_estimate.h)
};

std::vector<FlagSpec> mem_flag_specs() {
  return with_auto_plan_flags(
      {text_flag("config", "model config: tiny, tiny-moe, bench-dense, bench-moe or FILE.json", "tiny"),
       text_flag("recompute", "recompute plan, as for train", "none"),
       text_flag("device", "cpu, or meta: the step on shapes alone, its allocations exactly the CPU's", "cpu"),
       text_flag("dtype", "compute dtype: f32 or bf16 (parameters, gradients and optimizer state stay f32)", "f32"),
       int_flag("batch", "sequences per step (default: the config's)", std::nullopt, {.min = 1}),
       int_flag("seq", "tokens per sequence (default: the config's)", std::nullopt, {.min = 1}),
       text_flag("offload-dir", "directory for the offload plans' spill file (default: $TMPDIR or /tmp)"),
       int_flag("seed", "seed for weights, data and dropout", 0, {.min = 0}),
       int_flag("steps-before", "training steps run before the recorded one, so optimizer state exists", 1,
                {.min = 0}),
       text_flag("out", "write FILE.json and FILE.html (a trailing .json or .html is dropped) (required)"),
       int_flag("capacity", "allocator history capacity in events", std::int64_t(1) << 20, {.min = 1}),
       threads_flag_spec()});
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
  REMAT_CHECK(m.device.is_cpu() || m.device.is_meta(), DeviceError, "mem: --device ", m.device.str(),
              ": mem records the CPU's or meta's allocator (expected cpu or meta)");
  m.capacity = f.get_int("capacity");
  apply_threads_flag(f);
  m.seed = std::uint64_t(f.get_int("seed"));
  return m;
}

// The trainer's options for the recorded run (the plan resolved: auto is
// profiled and chosen here).
TrainOptions mem_train_options(const Flags& f, const MemOptions& m) {
  TrainOptions o;
  o.config = ModelConfig::load(f.get("config"));
  if (f.has("batch")) o.config.batch = f.get_int("batch");
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
// phases can be marked: same corpus, model, plan, AdamW, schedule and clip.
class MemTrainer {
 public:
  MemTrainer(const TrainOptions& o, const RecomputePlan& plan)
      : o_(o), alloc_(allocator_for(o.device)) {
    const ModelConfig& c = o.config;
    manual_seed(o.seed);
    {
      // On meta the model is built there: its parameters take no memory.
      DefaultDeviceScope on(o.device);
      model_ = std::make_unique<DecoderModel>(c, o.seed);
    }
    model_->set_compute_dtype(o.dtype);
    apply_recompute_plan(*model_, plan);
    AdamWOptions ao;
    ao.weight_decay = o.weight_decay;
    optimizer_ = std::make_unique<AdamW>(model_->named_parameters(), ao);
    if (!o.device.is_meta()) {
      corpus_ = generated_corpus(o.seed);
      sampler_ = std::make_unique<BatchSampler>(corpus_.train, c.batch, c.seq, o.seed + 1);
    }
    model_->train(true);
  }

  // The next batch: the sampler's, or on meta a batch of its shape (no tokens).
  Tensor next_batch() {
    if (sampler_) return sampler_->next();
    return empty({o_.config.batch, o_.config.seq + 1}, TensorOptions(DType::i64, o_.device));
  }

  // One training step as Trainer::run does it; `w` (when recording) marks
  // the phases. Returns the loss.
  double step(StepWatcher* w) {
    auto phase = [&](const char* name) {
      if (w) w->phase(name);
    };
    const double lr = cosine_lr(step_, o_.warmup, o_.steps, o_.lr, o_.min_lr);
    phase("zero_grad");
    Tensor batch = next_batch();
    model_->zero_grad();
    double loss = std::nan("");  // meta has no values
    {
      CategoryScope cat(MemoryCategory::activation);
      phase("forward");
      auto out = model_->forward_loss(batch);
      if (!o_.device.is_meta()) loss = out.loss.item();
      phase("backward");
      out.loss.backward();
    }
    phase("optimizer");
    clip_grad_norm(model_->parameters(), o_.clip);
    optimizer_->step(lr);
    ++step_;
    if (w) w->check_peak();
    alloc_.mark("end");
    return loss;
  }

  DecoderModel& model() { return *model_; }
  CachingAllocator& alloc() { return alloc_; }

 private:
  const TrainOptions& o_;
  Corpus corpus_;
  CachingAllocator& alloc_;
  std::unique_ptr<DecoderModel> model_;
  std::unique_ptr<AdamW> optimizer_;
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
  const auto& b = rec.block_saved_bytes;
  if (!b.empty()) {
    std::string per;
    if (b.size() <= 8) {
      for (std::size_t i = 0; i < b.size(); ++i) per += std::string(i ? ", " : "") + format_bytes(b[i]);
    } else {
      const auto [lo, hi] = std::minmax_element(b.begin(), b.end());
      std::int64_t total = 0;
      for (auto x : b) total += x;
      per = format_bytes(*lo) + " (block " + std::to_string(lo - b.begin()) + ") to " + format_bytes(*hi) + " (block " +
            std::to_string(hi - b.begin()) + "), " + format_bytes(total) + " over " + std::to_string(b.size()) +
            " blocks";
    }
    std::printf("  held for backward per block (after its forward): %s\n", per.c_str());
  }
  for (const auto& [k, v] : rec.info)
    if (k == estimate_key(m)) std::printf("  %s: %s\n", k.c_str(), v.c_str());
  std::printf("  wrote %s and %s\n", out.json_path().c_str(), out.html_path().c_str());
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
  alloc.enable_history(std::size_t(m.capacity));
  try {
    OpHookScope scope(watcher);
    OpHookScope estimate(estimator);
    const auto& off = run.model().block_stack().offload_hooks();
    const std::int64_t moved0 = off ? off->stats().moved_bytes() : 0;
    loss = run.step(watcher.get());
    if (off) estimator->add_transfer(off->stats().moved_bytes() - moved0);
    estimator->add_optimizer(run.model().num_parameters());
  } catch (...) {
    alloc.enable_history(0);
    throw;
  }
  rec.events = alloc.history();
  alloc.enable_history(0);
  run.model().model->blocks->set_observer(nullptr);
  rec.block_saved_bytes = blocks->bytes();
  *allocated_peak = alloc.stats().allocated_peak;
  const CheckpointCounters cc = checkpoint_counters();
  REMAT_CHECK(std::int64_t(rec.events.size()) < m.capacity || rec.events.empty() || rec.events.front().seq == 0,
              Error, "the step made more than --capacity ", m.capacity,
              " allocator events and the oldest were lost; run again with a larger --capacity");
  rec.saved_at_peak_by_op = watcher->saved_at_peak().bytes_by_op;
  rec.saved_at_peak_total = watcher->saved_at_peak().live_bytes;
  rec.info = {{"seed", std::to_string(m.seed)},
              {"steps before", std::to_string(m.steps_before)},
              {"device", o.device.str()},
              {"loss", o.device.is_meta() ? std::string("- (meta: shapes only)") : std::to_string(loss)},
              {"parameters", std::to_string(run.model().num_parameters())},
              {"replays", std::to_string(cc.replays)},
              {"recomputed ops", std::to_string(cc.ops_recomputed)},
              {"saved-bytes peak", format_bytes(saved_bytes_report().peak_bytes)},
              {"threads", std::to_string(num_threads())}};
  add_hook_info(run.model(), rec);
  const StepEstimate& e = estimator->estimate();
  rec.info.emplace_back(estimate_key(m), std::to_string(e.total() * 1e3) + " ms (forward " +
                                             std::to_string(e.forward * 1e3) + ", backward " +
                                             std::to_string(e.backward * 1e3) + ", replay " +
                                             std::to_string(e.replay * 1e3) + ", optimizer " +
                                             std::to_string(e.optimizer * 1e3) + ", offload " +
                                             std::to_string(e.offload * 1e3) + ")");
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

  MemTrainer run(o, plan);
  for (std::int64_t i = 0; i < m.steps_before; ++i) run.step(nullptr);
  std::int64_t allocated_peak = 0;
  const MemRecording rec = record_step(run, o, m, &allocated_peak);

  const Timeline t = build_timeline(rec);
  const TimelinePoint& peak = t.points.at(t.peak_point);
  REMAT_CHECK(peak.allocated == allocated_peak, Error, "the recorded events peak at ", peak.allocated,
              " bytes but the allocator's peak over the step is ", allocated_peak);
  out.write_and_keep(timeline_json(rec, t), timeline_html(rec, t));
  print_summary(rec, t, out, m);
  return 0;
}

}  // namespace remat::tools
