// ./remat mem: the allocator's history over one training step, written as
// JSON and as an HTML picture (tools/mem_timeline.h).
#include <cstdio>
#include <fstream>
#include <memory>

#include "checkpoint/checkpoint.h"
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

}  // namespace

int run_mem(const std::vector<std::string>& args) {
  Flags f("mem", "the allocator history over one training step as JSON and HTML", args,
          with_auto_plan_flags({text_flag("config", "model config: tiny, tiny-moe, bench-dense, bench-moe or FILE.json", "tiny"),
           text_flag("recompute", "recompute plan, as for train", "none"),
           text_flag("offload-dir", "directory for the offload plans' spill file (default: $TMPDIR or /tmp)"),
           int_flag("seed", "seed for weights, data and dropout", 0, {.min = 0}),
           int_flag("steps-before", "training steps run before the recorded one, so optimizer state exists", 1,
                    {.min = 0}),
           text_flag("out", "write FILE.json and FILE.html (a trailing .json or .html is dropped) (required)"),
           int_flag("capacity", "allocator history capacity in events", std::int64_t(1) << 20, {.min = 1}),
           threads_flag_spec()}));
  REMAT_CHECK(f.has("out"), Error, "--out FILE is required (writes FILE.json and FILE.html)");
  std::string stem = f.get("out");
  if (ends_with(stem, ".html"))
    stem.resize(stem.size() - 5);
  else if (ends_with(stem, ".json"))
    stem.resize(stem.size() - 5);
  REMAT_CHECK(!stem.empty() && !ends_with(stem, "/"), Error, "--out '", f.get("out"),
              "' names no file (expected e.g. --out out/tiny-mem)");
  const std::int64_t steps_before = f.get_int("steps-before");
  const std::int64_t capacity = f.get_int("capacity");
  apply_threads_flag(f);
  const auto seed = std::uint64_t(f.get_int("seed"));

  // The run the trainer would do (train/trainer.cc), step by step here so the
  // phases can be marked: same corpus, model, plan, AdamW, schedule and clip.
  TrainOptions o;
  o.config = ModelConfig::load(f.get("config"));
  o.config.validate();
  o.seed = seed;
  o.recompute = resolve_recompute(f, f.get("recompute"), o.config, "f32", kCPU, seed);
  const ModelConfig& c = o.config;
  RecomputePlan plan = RecomputePlan::parse(o.recompute, c.n_layers);
  if (f.has("offload-dir")) plan.offload_dir = f.get("offload-dir");

  // Open the outputs first: a bad path should not cost a training step.
  const std::string json_path = stem + ".json", html_path = stem + ".html";
  std::ofstream json_out(json_path), html_out(html_path);
  REMAT_CHECK(json_out.good(), IOError, "--out: cannot write ", json_path);
  REMAT_CHECK(html_out.good(), IOError, "--out: cannot write ", html_path);
  // Whatever fails from here on leaves no half-written outputs behind.
  struct RemoveUnlessKept {
    std::vector<std::string> paths;
    bool keep = false;
    ~RemoveUnlessKept() {
      if (!keep)
        for (const auto& p : paths) std::remove(p.c_str());
    }
  } cleanup{{json_path, html_path}};

  Corpus corpus = generated_corpus(o.seed);
  manual_seed(o.seed);
  DecoderModel model(c, o.seed);
  apply_recompute_plan(model, plan);
  AdamWOptions ao;
  ao.weight_decay = o.weight_decay;
  AdamW optimizer(model.named_parameters(), ao);
  BatchSampler sampler(corpus.train, c.batch, c.seq, o.seed + 1);
  model.train(true);

  auto& alloc = allocator_for(kCPU);
  std::int64_t step = 0;
  // One training step as Trainer::run does it; `w` (when recording) marks
  // the phases.
  auto train_step = [&](StepWatcher* w) {
    auto phase = [&](const char* name) {
      if (w) w->phase(name);
    };
    const double lr = cosine_lr(step, o.warmup, o.steps, o.lr, o.min_lr);
    phase("zero_grad");
    Tensor batch = sampler.next();
    model.zero_grad();
    double loss;
    {
      CategoryScope cat(MemoryCategory::activation);
      phase("forward");
      auto out = model.forward_loss(batch);
      loss = out.loss.item();
      phase("backward");
      out.loss.backward();
    }
    phase("optimizer");
    clip_grad_norm(model.parameters(), o.clip);
    optimizer.step(lr);
    ++step;
    if (w) w->check_peak();
    alloc.mark("end");
    return loss;
  };

  for (std::int64_t i = 0; i < steps_before; ++i) train_step(nullptr);

  // Record one step.
  MemRecording rec;
  rec.config = c.name;
  rec.plan = o.recompute;
  alloc.reset_peak();
  reset_saved_bytes_peak();
  reset_checkpoint_counters();
  const MemoryStats before = alloc.stats();
  rec.initial_bytes = before.category_bytes;
  rec.initial_reserved = before.reserved_bytes;
  auto watcher = std::make_shared<StepWatcher>(alloc);
  double loss = 0;
  alloc.enable_history(std::size_t(capacity));
  try {
    OpHookScope scope(watcher);
    loss = train_step(watcher.get());
  } catch (...) {
    alloc.enable_history(0);
    throw;
  }
  rec.events = alloc.history();
  alloc.enable_history(0);
  const MemoryStats after = alloc.stats();
  const CheckpointCounters cc = checkpoint_counters();
  REMAT_CHECK(std::int64_t(rec.events.size()) < capacity || rec.events.empty() || rec.events.front().seq == 0, Error,
              "the step made more than --capacity ", capacity,
              " allocator events and the oldest were lost; run again with a larger --capacity");
  rec.saved_at_peak_by_op = watcher->saved_at_peak().bytes_by_op;
  rec.saved_at_peak_total = watcher->saved_at_peak().live_bytes;
  rec.info = {{"seed", std::to_string(seed)},
              {"steps before", std::to_string(steps_before)},
              {"loss", std::to_string(loss)},
              {"parameters", std::to_string(model.num_parameters())},
              {"replays", std::to_string(cc.replays)},
              {"recomputed ops", std::to_string(cc.ops_recomputed)},
              {"saved-bytes peak", format_bytes(saved_bytes_report().peak_bytes)},
              {"threads", std::to_string(num_threads())}};
  if (const auto& off = model.model->blocks->offload_hooks()) {
    off->check();
    rec.info.emplace_back("offloaded to the spill file (all steps)", format_bytes(off->stats().bytes_written));
    rec.info.emplace_back("offload wait (all steps)", std::to_string(double(off->stats().wait_ns) * 1e-6) + " ms");
  }
  if (const auto& comp = model.model->blocks->compress_hooks())
    rec.info.emplace_back("compressed saves (all steps)", format_bytes(comp->stats().compressed_bytes) + " (from " +
                                                  format_bytes(comp->stats().original_bytes) + ")");

  const Timeline t = build_timeline(rec);
  const TimelinePoint& peak = t.points.at(t.peak_point);
  REMAT_CHECK(peak.allocated == after.allocated_peak, Error, "the recorded events peak at ", peak.allocated,
              " bytes but the allocator's peak over the step is ", after.allocated_peak);
  json_out << timeline_json(rec, t);
  html_out << timeline_html(rec, t);
  json_out.close();
  html_out.close();
  REMAT_CHECK(json_out.good(), IOError, "writing ", json_path, " failed");
  REMAT_CHECK(html_out.good(), IOError, "writing ", html_path, " failed");
  cleanup.keep = true;

  std::int64_t replays = 0;
  for (const auto& ph : t.phases) replays += ph.name == "replay";
  std::printf("mem: %s, recompute %s: peak allocated %s at %.2f ms (%s%s%s), reserved peak %s, %zu events, "
              "%lld replay phases\n",
              c.name.c_str(), o.recompute.c_str(), format_bytes(peak.allocated).c_str(), double(peak.t_ns) / 1e6,
              t.peak_phase.c_str(), t.peak_tag.empty() ? "" : ", op ", t.peak_tag.c_str(),
              format_bytes(t.reserved_peak).c_str(), rec.events.size(), static_cast<long long>(replays));
  std::printf("  wrote %s and %s\n", json_path.c_str(), html_path.c_str());
  return 0;
}

}  // namespace remat::tools
