#include "train/auto_plan.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>

#include "checkpoint/offload.h"
#include "checkpoint/plan.h"
#include "checkpoint/time_estimate.h"
#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/device_runtime.h"
#include "engine/error.h"
#include "engine/rng.h"
#include "models/block_stack.h"
#include "models/decoder.h"
#include "models/recompute.h"
#include "models/tensor_parallel.h"
#include "train/hf_model.h"
#include "moe/dispatch.h"
#include "parallel/simulated_group.h"
#include "train/data.h"
#include "train/optimizer.h"
#include "train/train_options.h"
#include "train/zero.h"

namespace remat {

namespace {

using Clock = std::chrono::steady_clock;
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

template <typename T>
T median_of(std::vector<T> v) {
  if (v.empty()) return T{};
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : T((v[v.size() / 2 - 1] + v[v.size() / 2]) / 2);
}

// One step's measurements, per block.
struct StepMeasure {
  std::vector<std::int64_t> fwd_before, fwd_peak, fwd_after, bwd_start, bwd_peak;
  std::vector<double> fwd_ms, bwd_ms;
  std::int64_t pre_peak = 0, head_peak = 0, tail_peak = 0, peak = 0;
  std::int64_t loss_peak = 0;  // MemoryCategory::loss's peak over the step
  double step_ms = 0;
  std::int64_t dispatch_bytes = 0, replay_dispatch_bytes = 0;  // MoE tokens moved in the forward / again in replays
};

// Windows of the step: before the blocks (embedding), each block's forward,
// the head (from the last block's end until its backward starts), each
// block's backward, and the rest (embedding backward, clipping, AdamW). The
// allocator's peak is reset at each window's start and read at its end.
class Probe final : public BlockObserver {
 public:
  // `clock`: on meta, the time estimate whose running total is the step's
  // clock (null: the wall clock).
  Probe(CachingAllocator& alloc, Device device, std::int64_t n, const StepTimeEstimator* clock)
      : alloc_(alloc), device_(device), n_(n), clock_(clock) {}

  void start_step() {
    m_ = StepMeasure{};
    for (auto* v : {&m_.fwd_before, &m_.fwd_peak, &m_.fwd_after, &m_.bwd_start, &m_.bwd_peak})
      v->assign(std::size_t(n_), 0);
    m_.fwd_ms.assign(std::size_t(n_), 0);
    m_.bwd_ms.assign(std::size_t(n_), 0);
    open();
    step_t0_ = t_;
  }
  void before_block(std::int64_t i, const Tensor& x) override {
    const std::int64_t p = close();
    if (i == 0) {
      m_.pre_peak = p;
      if (x.requires_grad())  // block 0's backward ends when x's gradient is complete
        x.register_hook([this](const Tensor&) {
          m_.bwd_peak[0] = close();
          m_.bwd_ms[0] = last_ms_;
          open();
          return Tensor();
        });
    }
    m_.fwd_before[std::size_t(i)] = alloc_.stats().allocated_bytes;
    open();
  }
  void after_block(std::int64_t i, const Tensor& y) override {
    m_.fwd_peak[std::size_t(i)] = close();
    m_.fwd_ms[std::size_t(i)] = last_ms_;
    m_.fwd_after[std::size_t(i)] = alloc_.stats().allocated_bytes;
    // y's gradient is complete when block i+1's backward (or the head's)
    // has run: block i's backward starts.
    if (y.requires_grad())
      y.register_hook([this, i](const Tensor&) {
        const std::int64_t p = close();
        if (i == n_ - 1) {
          m_.head_peak = p;
        } else {
          m_.bwd_peak[std::size_t(i + 1)] = p;
          m_.bwd_ms[std::size_t(i + 1)] = last_ms_;
        }
        m_.bwd_start[std::size_t(i)] = alloc_.stats().allocated_bytes;
        open();
        return Tensor();
      });
    open();
  }
  StepMeasure end_step() {
    m_.tail_peak = close();
    m_.step_ms = ms_between(step_t0_, t_);  // (close() set t_ to now)
    return m_;
  }

 private:
  Clock::time_point now() {
    if (clock_)
      return Clock::time_point(
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(clock_->estimate().total())));
    if (!device_.is_cpu()) synchronize(device_);
    return Clock::now();
  }
  void open() {
    alloc_.reset_peak();
    t_ = now();
  }
  // Ends the window opened last: returns its peak, last_ms_ its duration.
  std::int64_t close() {
    const MemoryStats st = alloc_.stats();
    const std::int64_t p = st.allocated_peak;
    m_.peak = std::max(m_.peak, p);
    m_.loss_peak = std::max(m_.loss_peak, st.category_peak[std::size_t(MemoryCategory::loss)]);
    const auto t = now();
    last_ms_ = ms_between(t_, t);
    t_ = t;
    return p;
  }

  CachingAllocator& alloc_;
  Device device_;
  std::int64_t n_;
  StepMeasure m_;
  Clock::time_point t_, step_t0_;
  double last_ms_ = 0;
  const StepTimeEstimator* clock_;
};

// Records every save of a step (an identity hook: it keeps the tensor as is).
class SaveTrace final : public TypedSavedTensorHooks {
 public:
  std::string name() const override { return "profile trace"; }
  std::any pack_tensor(const Tensor& t, const SaveInfo& info) override {
    ProfiledSave s;
    s.block = block;
    s.op = info.op;
    s.bytes = std::int64_t(info.bytes);
    s.is_output = info.is_output;
    s.saved_at = events_++;
    index_[info.id] = saves.size();
    saves.push_back(s);
    return t;
  }
  Tensor unpack_tensor(std::any packed, const SaveInfo& info) override {
    release(info);
    return std::any_cast<Tensor>(packed);
  }
  void on_release(const std::any&, const SaveInfo& info) override { release(info); }

  std::int64_t block = -1;
  std::vector<ProfiledSave> saves;

 private:
  void release(const SaveInfo& info) {
    auto it = index_.find(info.id);
    if (it != index_.end() && saves[it->second].released_at == 0) saves[it->second].released_at = events_++;
  }
  std::int64_t events_ = 1;
  std::map<std::uint64_t, std::size_t> index_;
};

// Tells the trace which block runs.
class TraceBlocks final : public BlockObserver {
 public:
  TraceBlocks(std::shared_ptr<BlockObserver> inner, SaveTrace* trace) : inner_(std::move(inner)), trace_(trace) {}
  void before_block(std::int64_t i, const Tensor& x) override {
    inner_->before_block(i, x);
    trace_->block = i;
  }
  void after_block(std::int64_t i, const Tensor& y) override {
    trace_->block = -1;
    inner_->after_block(i, y);
  }

 private:
  std::shared_ptr<BlockObserver> inner_;
  SaveTrace* trace_;
};

// The candidates that are not per-block choices of their own: chunked_loss
// is a whole plan; keep_gathered changes every other choice.
const std::string kChunkedLoss = "chunked_loss", kKeepGathered = "keep_gathered";

// True if any '+' part of the component is an MoE part (moe_expert+offload too).
bool is_moe_component(const std::string& c) {
  std::size_t start = 0;
  while (start <= c.size()) {
    const std::size_t plus = c.find('+', start);
    const std::string p = c.substr(start, plus == std::string::npos ? std::string::npos : plus - start);
    if (p == "moe_expert" || p.rfind("selective:moe", 0) == 0 || p == "selective:shared_experts") return true;
    if (plus == std::string::npos) break;
    start = plus + 1;
  }
  return false;
}

// The component's plan string on every block of n.
std::string whole_plan(const std::string& component, std::int64_t n) {
  std::vector<std::vector<PlanChoice>> choices(std::size_t(n), std::vector<PlanChoice>{PlanChoice{component}});
  return plan_string(choices, std::vector<std::size_t>(std::size_t(n), 0));
}

// The bench worker's training step on a fresh model of opts.config (seeded
// weights, AdamW or ZeRO, the generated corpus and its sampler): one setup
// for the profile and the checking run. Under a job (opts.job) every rank
// builds it and runs the same steps together.
class StepRig {
 public:
  explicit StepRig(const ProfileOptions& o)
      : seed_(o.seed), device(o.device), job_(o.job && o.job->size() > 1 ? o.job : nullptr),
        split_(split_for(o)), layout_(layout_for(o)),
        building_(std::in_place, o.device),
        model(o.config, o.seed, layout_.placement()), update(init_model(o)),
        corpus(generated_corpus(o.seed, std::int64_t(1) << 20, o.config.seq + 2)),
        sampler(corpus.train, o.config.batch, o.config.seq, o.seed + 1) {
    building_.reset();
  }
  StepRig(const StepRig&) = delete;
  StepRig& operator=(const StepRig&) = delete;

  // One step: zero the gradients, `before` (the start of what is measured),
  // forward with `trace` on (if set), backward (with a simulated rank's
  // gradient buckets, or the job's reductions), clip, AdamW; then the
  // offload check.
  void step(const std::function<void()>& before, const std::shared_ptr<SavedTensorHooks>& trace = nullptr) {
    Tensor batch = batch_shard(sampler.next(), *layout_.world).to(device);
    model.zero_grad();
    update.zero_shards();
    synchronize(device);
    before();
    {
      const int W = real_job_ ? layout_.world->size() : 1;
      RngShardScope shard(real_job_ ? layout_.world->rank() : 0, W);
      std::unique_ptr<SavedTensorHooksScope> tracing;
      if (trace) tracing = std::make_unique<SavedTensorHooksScope>(trace);
      Tensor loss = model.forward_loss(batch).loss;
      if (!device.is_meta()) (void)loss.item();
      tracing.reset();
      update.backward(loss, 1.0 / double(W));
    }
    update.step(trainable_tensors(model), 1.0, 1e-3);
    synchronize(device);
    if (const auto& off = model.block_stack().offload_hooks()) off->check();
  }

  // The job's group (null: one process, or a simulated rank).
  ProcessGroup* job() const { return job_.get(); }

 private:
  struct Seed {
    explicit Seed(std::uint64_t s) { manual_seed(s); }  // before the model draws its weights
  } seed_;

 public:
  Device device;

 private:
  // One process, the ranks of a job, or the simulated rank of a data- and
  // expert-parallel job.
  // The ranks of the job (or of the simulated one) split for --tp: the
  // tensor-parallel group (null without) and the rest.
  TensorParallelJob split_for(const ProfileOptions& o) const {
    REMAT_CHECK(o.tp == 1 || job_, Error, "the planner profiles --tp ", o.tp, " on the ranks of a job (under mpirun)");
    if (job_) return split_tensor_parallel(job_, o.config, o.tp, o.sp);
    if (!o.world) return {};
    return split_tensor_parallel(simulated_world(int(o.world->ranks()), o.rank), o.config, o.world->tp, o.world->sp);
  }
  ParallelLayout layout_for(const ProfileOptions& o) {
    if (job_) return make_parallel_layout(split_.rest, o.ep, o.config);
    if (!o.world) return make_parallel_layout(single_process_group(), 1, o.config);
    REMAT_CHECK(o.device.is_meta(), DeviceError, "the planner simulates a rank of a job on meta only, got --device ",
                o.device.str());
    REMAT_CHECK(o.world->pp == 1, Error, "the planner profiles one process's blocks; a pipeline (",
                o.world->str(), ") is not planned yet: plan its stage's blocks with dp and ep only, or run mem "
                "--simulate-world with a hand plan");
    return make_parallel_layout(split_.rest, o.world->ep, o.config);
  }
  bool real_job_ = false;
  std::shared_ptr<ProcessGroup> job_;  // every rank of the job (null: one process or a simulated rank)
  TensorParallelJob split_;            // --tp's group (null without) and the data-parallel ranks of this rank
  ParallelLayout layout_;
  // The model is built on meta there (no memory, nothing drawn), else on
  // the CPU and moved to its device (init_model), as the trainer does.
  struct BuildOn {
    explicit BuildOn(Device d) : scope(d.is_meta() ? kMeta : kCPU) {}
    DefaultDeviceScope scope;
  };
  std::optional<BuildOn> building_;

 public:
  DecoderModel model;
  DataParallelUpdate update;
  Corpus corpus;
  BatchSampler sampler;

 private:
  DataParallelUpdate init_model(const ProfileOptions& o) {
    real_job_ = o.job && o.job->size() > 1;
    if (!o.weights_dir.empty()) keep_frozen_in_folder_dtypes(model, o.weights_dir);
    if (o.world || real_job_) apply_parallel_layout(model, layout_, true);  // (as train runs it)
    if (split_.tp) apply_tensor_parallel(model, split_.tp);
    model.set_compute_dtype(compute_dtype_from_name(o.dtype));
    model.to(o.device);
    return make_data_parallel_update(layout_, model.trainable_parameters(), TrainOptions{}.bucket_bytes,
                                     o.zero_stage(), {}, model);
  }
};

}  // namespace

std::vector<std::string> default_candidates(const ModelConfig& c, bool allow_lossy, std::int64_t zero) {
  std::vector<std::string> v = {"per_block",     "attention",         "selective:core_attn",
                                "selective:mlp", "selective:save_matmul", "offload",
                                "per_block+offload", "attention+offload", "selective:mlp+offload"};
  if (c.experts > 0) {
    v.push_back("moe_expert");
    v.push_back("selective:moe_act");
    v.push_back("moe_expert+offload");
  }
  if (allow_lossy) {
    v.push_back("compress:fp8");
    v.push_back("compress:bf16");
    v.push_back("per_block+compress:fp8");
  }
  v.push_back(kChunkedLoss);
  if (zero == 3) v.push_back(kKeepGathered);
  return v;
}

namespace {

// One candidate of the profile: its component ("" keeps everything), the
// plan string with it on every block, and that plan parsed.
struct CandidatePlan {
  std::string component, spec;
  RecomputePlan plan;
};

// `none` first, then opts.candidates (or the default ones), each on every block.
std::vector<CandidatePlan> candidate_plans(const ProfileOptions& opts) {
  const std::int64_t n = opts.config.n_layers;
  std::vector<std::string> comps{""};
  for (const auto& s : opts.candidates.empty() ? default_candidates(opts.config, opts.allow_lossy, opts.zero_stage())
                                                : opts.candidates)
    if (!s.empty() && s != "none") comps.push_back(s);
  std::vector<CandidatePlan> out;
  for (const auto& comp : comps) {
    // chunked_loss is about the head, not the blocks: the plan is itself.
    CandidatePlan c{comp, comp.empty() ? "none" : comp == kChunkedLoss ? comp : whole_plan(comp, n), {}};
    c.plan = RecomputePlan::parse(c.spec, n);
    c.plan.offload_dir = opts.offload_dir;
    out.push_back(std::move(c));
  }
  return out;
}

// One step of `rig` under the plan already applied, measured by `probe` (and
// traced into `trace` when set).
StepMeasure measure_step(StepRig& rig, const std::shared_ptr<Probe>& probe, const std::shared_ptr<SaveTrace>& trace,
                         StepTimeEstimator* estimator) {
  BlockStack& stack = *rig.model.model->blocks;
  if (trace)
    stack.set_observer(std::make_shared<TraceBlocks>(probe, trace.get()));
  else
    stack.set_observer(probe);
  DispatchCounters moved0;
  const auto& offload = rig.model.block_stack().offload_hooks();
  const auto moved_to_host = [&] { return offload ? offload->stats().moved_bytes() : 0; };
  std::int64_t host0 = 0;
  rig.step([&] {
    moved0 = dispatch_counters();
    host0 = moved_to_host();
    probe->start_step();
  }, trace);
  if (estimator) {  // (meta: the estimate is the step's clock)
    estimator->add_transfer(moved_to_host() - host0);
    estimator->add_optimizer(rig.model.num_parameters());
  }
  StepMeasure m = probe->end_step();
  m.dispatch_bytes = dispatch_counters().bytes_moved - moved0.bytes_moved;
  m.replay_dispatch_bytes = dispatch_counters().replay_bytes_moved - moved0.replay_bytes_moved;
  stack.set_observer(nullptr);
  return m;
}

// Every candidate's step in each round (round 0 the warm-up, not kept; its
// `none` step traces every save into prof.saves), the order rotating each
// round. Returns the measured rounds per candidate.
std::vector<std::vector<StepMeasure>> measure_rounds(const ProfileOptions& opts, StepRig& rig,
                                                     const std::vector<CandidatePlan>& cands, PlanProfile& prof) {
  // On meta the step's clock is the time estimate (the same for every round).
  std::shared_ptr<StepTimeEstimator> estimator;
  if (opts.device.is_meta()) estimator = std::make_shared<StepTimeEstimator>(device_model(opts.device_model));
  OpHookScope estimating(estimator ? std::shared_ptr<OpHook>(estimator) : std::make_shared<OpHook>());
  auto probe = std::make_shared<Probe>(allocator_for(opts.device), opts.device, opts.config.n_layers, estimator.get());
  const std::size_t K = cands.size();
  std::vector<std::vector<StepMeasure>> measured(K);
  for (std::int64_t round = 0; round <= opts.rounds; ++round) {
    for (std::size_t j = 0; j < K; ++j) {
      const std::size_t k = (j + std::size_t(round)) % K;  // rotate the order each round
      if (opts.progress)
        opts.progress("profile round " + std::to_string(round) + "/" + std::to_string(opts.rounds) + " " +
                      cands[k].spec);
      apply_recompute_plan(rig.model, cands[k].plan);
      // The warm-up step of none also traces every save.
      const auto trace = round == 0 && k == 0 ? std::make_shared<SaveTrace>() : nullptr;
      const StepMeasure m = measure_step(rig, probe, trace, estimator.get());
      if (trace) prof.saves = trace->saves;
      if (round > 0) measured[k].push_back(m);
    }
  }
  return measured;
}

// A job's ranks measured their own steps: each measurement becomes the most
// over the ranks (the fullest rank's bytes, the slowest rank's times), so
// every rank derives the same profile and plans the same.
void take_most_over_ranks(ProcessGroup& job, std::vector<std::vector<StepMeasure>>& measured) {
  std::vector<std::int64_t> bytes;
  const auto visit = [&](auto&& on_bytes, auto&& on_time) {
    for (auto& rounds : measured)
      for (StepMeasure& m : rounds) {
        for (auto* v : {&m.fwd_before, &m.fwd_peak, &m.fwd_after, &m.bwd_start, &m.bwd_peak})
          for (auto& x : *v) on_bytes(x);
        for (auto* x : {&m.pre_peak, &m.head_peak, &m.tail_peak, &m.peak, &m.loss_peak, &m.dispatch_bytes,
                        &m.replay_dispatch_bytes})
          on_bytes(*x);
        for (auto* v : {&m.fwd_ms, &m.bwd_ms})
          for (auto& x : *v) on_time(x);
        on_time(m.step_ms);
      }
  };
  // (Times travel as integer nanoseconds.)
  visit([&](std::int64_t& x) { bytes.push_back(x); }, [&](double& x) { bytes.push_back(std::llround(x * 1e6)); });
  bytes = most_over_ranks(job, bytes);
  std::size_t i = 0;
  visit([&](std::int64_t& x) { x = bytes[i++]; }, [&](double& x) { x = double(bytes[i++]) * 1e-6; });
}

// Per block, the median over the rounds of a per-block time.
std::vector<double> median_per_block(const std::vector<StepMeasure>& ms, std::vector<double> StepMeasure::*field) {
  std::vector<double> out((ms[0].*field).size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::vector<double> v;
    for (const auto& m : ms) v.push_back((m.*field)[i]);
    out[i] = median_of(v);
  }
  return out;
}

// One candidate's measurements reduced: memory from its round with the
// highest step peak (MoE routing makes the bytes depend on the batch: plan
// for the worst one seen), as one consistent set; times are medians over the
// rounds.
struct Derived {
  std::vector<std::int64_t> held, fwd_before, fwd_peak, bwd_start, bwd_peak;
  std::vector<double> ms;  // forward + backward per block
  std::int64_t head_peak = 0, pre_peak = 0, tail_peak = 0, peak = 0, loss_peak = 0;
  double step_ms = 0;
  std::int64_t dispatch_bytes = 0, replay_dispatch_bytes = 0;
  double peak_spread = 0;  // (max - min) / max of the step peak over the rounds

  // Held bytes of blocks 0..upto-1.
  std::int64_t sum_held(std::int64_t upto) const {
    std::int64_t s = 0;
    for (std::int64_t j = 0; j < upto; ++j) s += held[std::size_t(j)];
    return s;
  }
};

Derived derive(const std::vector<StepMeasure>& ms, std::int64_t n) {
  Derived x;
  std::size_t worst = 0;
  std::int64_t lo = ms[0].peak;
  for (std::size_t r = 0; r < ms.size(); ++r) {
    if (ms[r].peak > ms[worst].peak) worst = r;
    lo = std::min(lo, ms[r].peak);
  }
  const StepMeasure& w = ms[worst];
  x.peak_spread = double(w.peak - lo) / double(std::max<std::int64_t>(1, w.peak));
  x.fwd_before = w.fwd_before;
  x.fwd_peak = w.fwd_peak;
  x.bwd_start = w.bwd_start;
  x.bwd_peak = w.bwd_peak;
  const auto f = median_per_block(ms, &StepMeasure::fwd_ms), b = median_per_block(ms, &StepMeasure::bwd_ms);
  for (std::int64_t i = 0; i < n; ++i) {
    x.held.push_back(std::max<std::int64_t>(0, w.fwd_after[std::size_t(i)] - w.fwd_before[std::size_t(i)]));
    x.ms.push_back(f[std::size_t(i)] + b[std::size_t(i)]);
  }
  x.head_peak = w.head_peak;
  x.pre_peak = w.pre_peak;
  x.tail_peak = w.tail_peak;
  x.peak = w.peak;
  x.loss_peak = w.loss_peak;
  std::vector<double> steps;
  for (const auto& m : ms) steps.push_back(m.step_ms);
  x.step_ms = median_of(steps);
  x.dispatch_bytes = w.dispatch_bytes;
  x.replay_dispatch_bytes = w.replay_dispatch_bytes;
  return x;
}

// The planner's bases (planner.h) from a step that kept every block's saves.
struct Bases {
  std::int64_t forward_base = 0, block_forward_base = 0, fixed_peak = 0;
  std::vector<std::int64_t> backward_bases;
};
Bases bases_of(const Derived& x, std::int64_t n) {
  Bases b;
  b.block_forward_base = x.fwd_before[0];
  b.forward_base = x.head_peak - x.sum_held(n);
  b.fixed_peak = std::max(x.pre_peak, x.tail_peak);
  for (std::int64_t i = 0; i < n; ++i) b.backward_bases.push_back(x.bwd_start[std::size_t(i)] - x.sum_held(i + 1));
  return b;
}

// The planner's bases from the `none` candidate.
void set_bases(PlanProfile& prof, const Derived& none) {
  prof.none_peak = none.peak;
  prof.none_step_ms = none.step_ms;
  prof.none_loss_peak = none.loss_peak;
  Bases b = bases_of(none, prof.n_blocks);
  prof.block_forward_base = b.block_forward_base;
  prof.forward_base = b.forward_base;
  prof.fixed_peak = b.fixed_peak;
  prof.backward_bases = std::move(b.backward_bases);
}

// The chunked loss's bases and cost from its step (`x`) against none's.
ChunkedLossProfile chunked_loss_profile(const Derived& x, const Derived& none, std::int64_t n) {
  ChunkedLossProfile c;
  c.measured = true;
  Bases b = bases_of(x, n);
  c.forward_base = b.forward_base;
  c.block_forward_base = b.block_forward_base;
  c.fixed_peak = b.fixed_peak;
  c.backward_bases = std::move(b.backward_bases);
  c.loss_peak = x.loss_peak;
  c.extra_ms = std::max(0.0, x.step_ms - none.step_ms);
  return c;
}

// Per block, the step time a candidate measured as `x` adds to none's:
// blocks of one kind (dense, MoE) run the same code, so differences between
// their windows are noise and each takes its kind's mean change; the step's
// change outside the windows is shared between all blocks.
std::vector<double> time_changes(const PlanProfile& prof, const Derived& x, const Derived& none) {
  const std::int64_t n = prof.n_blocks;
  double window_delta = 0;
  std::map<bool, std::pair<double, int>> kind;  // moe -> (sum of changes, blocks)
  for (std::int64_t i = 0; i < n; ++i) {
    const double dlt = x.ms[std::size_t(i)] - none.ms[std::size_t(i)];
    window_delta += dlt;
    auto& [sum, cnt] = kind[prof.moe_blocks[std::size_t(i)]];
    sum += dlt;
    ++cnt;
  }
  const double rest = (x.step_ms - none.step_ms - window_delta) / double(n);
  std::vector<double> out;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto& [sum, cnt] = kind[prof.moe_blocks[std::size_t(i)]];
    out.push_back(sum / cnt + rest);
  }
  return out;
}

// Candidate `c` (measured as `x`) with its per-block costs against `none`
// (`is_none`: it is none itself, so every block's time is 0).
ProfiledCandidate candidate_costs(const PlanProfile& prof, const CandidatePlan& c, const Derived& x,
                                  const Derived& none, bool is_none) {
  const std::int64_t n = prof.n_blocks;
  ProfiledCandidate pc;
  pc.component = c.component;
  pc.plan = c.spec;
  pc.lossy = c.plan.compress;
  pc.hooks = (c.plan.offload ? kOffloadHook : 0u) | (c.plan.compress ? kCompressHook : 0u);
  pc.step_ms = x.step_ms;
  pc.peak = x.peak;
  pc.dispatch_bytes = x.dispatch_bytes;
  pc.replay_dispatch_bytes = x.replay_dispatch_bytes;
  const std::vector<double> times = time_changes(prof, x, none);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::size_t u = std::size_t(i);
    PlanChoice ch;
    ch.component = c.component;
    ch.lossy = pc.lossy;
    ch.hooks = pc.hooks;
    ch.held = x.held[u];
    ch.forward_work = std::max<std::int64_t>(0, x.fwd_peak[u] - prof.block_forward_base - x.sum_held(i));
    ch.work = std::max<std::int64_t>(0, x.bwd_peak[u] - prof.backward_bases[u] - x.sum_held(i + 1));
    // (Never below keeping everything: a plan that measures faster than
    // none does so by noise.)
    ch.time_ms = is_none ? 0.0 : std::max(0.0, times[u]);
    pc.blocks.push_back(ch);
  }
  return pc;
}

// keep_gathered (measured as `x`, every block keeping its parameters) as
// changes to the costs of keeping everything (`none`, measured as `nd`).
KeepGatheredProfile keep_gathered_profile(const PlanProfile& prof, const CandidatePlan& c, const Derived& x,
                                          const Derived& nd) {
  const ProfiledCandidate kept = candidate_costs(prof, c, x, nd, false);
  const ProfiledCandidate& none = prof.candidates.at(0);
  const std::vector<double> times = time_changes(prof, x, nd);
  KeepGatheredProfile k;
  k.measured = true;
  for (std::size_t i = 0; i < std::size_t(prof.n_blocks); ++i) {
    const PlanChoice &a = kept.blocks[i], &b = none.blocks[i];
    PlanChoice d;
    d.component = kKeepGathered;
    d.hooks = kKeepGatheredHook;
    d.held = std::max<std::int64_t>(0, a.held - b.held);
    d.forward_work = a.forward_work - b.forward_work;
    d.work = a.work - b.work;
    d.time_ms = std::min(0.0, times[i]);  // (never slower: a gather fewer; slower is noise)
    k.delta.push_back(d);
  }
  return k;
}

}  // namespace

PlanProfile profile_plans(const ProfileOptions& opts) {
  const auto wall0 = Clock::now();
  const ModelConfig& c = opts.config;
  const std::int64_t n = c.n_layers;
  REMAT_CHECK(opts.rounds >= 1, Error, "plan profile: rounds must be >= 1, got ", opts.rounds);
  const std::vector<CandidatePlan> cands = candidate_plans(opts);

  StepRig rig(opts);
  PlanProfile prof;
  prof.config = c.name;
  prof.n_blocks = n;
  for (std::int64_t i = 0; i < n; ++i) prof.moe_blocks.push_back(c.is_moe_layer(i));
  auto measured = measure_rounds(opts, rig, cands, prof);
  if (ProcessGroup* job = rig.job()) take_most_over_ranks(*job, measured);
  apply_recompute_plan(rig.model, RecomputePlan::parse("none", n));
  prof.persistent = rig.update.persistent_bytes(rig.model.named_parameters());
  prof.sharding_working = rig.update.working_bytes();

  std::vector<Derived> d;
  for (const auto& ms : measured) {
    d.push_back(derive(ms, n));
    prof.peak_spread = std::max(prof.peak_spread, d.back().peak_spread);
  }
  set_bases(prof, d[0]);
  for (std::size_t k = 0; k < cands.size(); ++k) {
    if (cands[k].component == kChunkedLoss)
      prof.chunked_loss = chunked_loss_profile(d[k], d[0], n);
    else if (cands[k].component == kKeepGathered)
      prof.keep_gathered = keep_gathered_profile(prof, cands[k], d[k], d[0]);
    else
      prof.candidates.push_back(candidate_costs(prof, cands[k], d[k], d[0], k == 0));
  }
  prof.seconds = ms_between(wall0, Clock::now()) * 1e-3;
  return prof;
}

namespace {

// The component without its offload/compress parts ("" for keeping everything).
std::string without_hooks(const std::string& component) {
  std::string out, part;
  std::istringstream in(component);
  while (std::getline(in, part, '+'))
    if (part.rfind("offload", 0) != 0 && part.rfind("compress", 0) != 0) out += (out.empty() ? "" : "+") + part;
  return out;
}

// Drops each hooked choice that holds no fewer bytes than the same component
// without its hook (an offload that found nothing to take on this block,
// e.g. per_block's small block inputs): the same plan, only with a hook.
// "No fewer" allows for less than the smallest save a hook takes (offload's
// 64 KiB): two runs of one plan can differ by a cached block's unsplit tail
// (which block a request gets follows the order frees arrive in, and
// offload's writer frees from its own thread), and such a hook took nothing.
void drop_idle_hooks(std::vector<PlanChoice>& cs) {
  const std::int64_t kTook = std::int64_t(OffloadOptions{}.min_bytes);
  std::vector<PlanChoice> kept;
  for (const PlanChoice& h : cs) {
    bool idle = false;
    if (h.hooks != 0)
      for (const PlanChoice& u : cs)
        idle = idle || (u.hooks == 0 && u.component == without_hooks(h.component) && h.held + kTook > u.held &&
                        h.work + kTook > u.work && h.forward_work + kTook > u.forward_work);
    if (!idle) kept.push_back(h);
  }
  cs = std::move(kept);
}

// Every choice of a block whose gather keep_gathered saves time also with
// keep_gathered (its `delta` added).
void add_keep_gathered(std::vector<std::vector<PlanChoice>>& choices, const std::vector<PlanChoice>& delta) {
  for (std::size_t i = 0; i < choices.size(); ++i) {
    const PlanChoice& d = delta.at(i);
    if (!(d.time_ms < 0)) continue;
    const std::size_t k = choices[i].size();
    for (std::size_t q = 0; q < k; ++q) {
      PlanChoice c = choices[i][q];
      c.component = c.component.empty() ? d.component : c.component + "+" + d.component;
      c.hooks |= d.hooks;
      c.held += d.held;
      c.forward_work = std::max<std::int64_t>(0, c.forward_work + d.forward_work);
      c.work = std::max<std::int64_t>(0, c.work + d.work);
      c.time_ms += d.time_ms;
      choices[i].push_back(c);
    }
  }
}

}  // namespace

PlannerInput PlanProfile::planner_input(std::int64_t budget, bool allow_lossy, bool chunked) const {
  PlannerInput in;
  const bool c = chunked && chunked_loss.measured;
  in.forward_base = c ? chunked_loss.forward_base : forward_base;
  in.backward_bases = c ? chunked_loss.backward_bases : backward_bases;
  in.block_forward_base = c ? chunked_loss.block_forward_base : block_forward_base;
  in.fixed_peak = c ? chunked_loss.fixed_peak : fixed_peak;
  in.budget = budget;
  in.allow_lossy = allow_lossy;
  in.choices.assign(std::size_t(n_blocks), {});
  for (const auto& c : candidates)
    for (std::int64_t i = 0; i < n_blocks; ++i) {
      // MoE parts only on MoE blocks (a dense block has none to wrap).
      if (is_moe_component(c.component) && !moe_blocks.at(std::size_t(i))) continue;
      in.choices[std::size_t(i)].push_back(c.blocks[std::size_t(i)]);
    }
  for (auto& cs : in.choices) drop_idle_hooks(cs);
  if (keep_gathered.measured) add_keep_gathered(in.choices, keep_gathered.delta);
  return in;
}

std::int64_t parse_memory_budget(const std::string& text, const PlanProfile& profile) {
  auto bad = [&]() {
    return Error("--memory-budget '" + text +
                 "': expected bytes with an optional unit (B, KB, MB, GB, KiB, MiB, GiB; e.g. 1.5GiB), meaning peak "
                 "allocated on the device, or N% (persistent bytes, and under --zero the sharding's working set, plus N% of "
                 "plan none's activation bytes)");
  };
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    throw bad();
  }
  std::string unit = text.substr(used);
  if (!(v >= 0) || !std::isfinite(v)) throw bad();
  if (unit == "%") {
    const double act = double(profile.none_activation_bytes());
    return std::int64_t(double(profile.base_bytes()) + v / 100.0 * act);
  }
  static const std::map<std::string, double> units = {{"", 1},          {"B", 1},           {"KB", 1e3},
                                                      {"MB", 1e6},        {"GB", 1e9},          {"KiB", 1024.0},
                                                      {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
  auto it = units.find(unit);
  if (it == units.end()) throw bad();
  return std::int64_t(v * it->second);
}

std::string format_mib(std::int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / 1048576.0);
  return buf;
}

namespace {

// Leaves offload and compression out of every block's choices.
void drop_hooks(PlannerInput& in) {
  for (auto& cs : in.choices)
    cs.erase(std::remove_if(cs.begin(), cs.end(),
                            [](const PlanChoice& c) { return (c.hooks & (kOffloadHook | kCompressHook)) != 0; }),
             cs.end());
}

// The component without keep_gathered ("" for it alone).
std::string without_keep_gathered(const std::string& component) {
  if (component == kKeepGathered) return "";
  const std::string tail = "+" + kKeepGathered;
  if (component.size() > tail.size() && component.compare(component.size() - tail.size(), tail.size(), tail) == 0)
    return component.substr(0, component.size() - tail.size());
  return component;
}

// The plan's number of '+' parts (0 for none).
std::ptrdiff_t plan_parts(const std::string& p) { return p == "none" ? 0 : 1 + std::count(p.begin(), p.end(), '+'); }

// A simpler plan (keep or one component per block) whose predicted step is
// within 2% of the optimum's wins: fewer parts behave more like the
// profile's runs (each component on every block), so their predictions hold
// better than those of an intricate mix whose gain is within the noise.
// Sets a.optimum to the solver's answer, a.best to the plan kept.
void prefer_simpler_plan(const PlanProfile& profile, const PlannerInput& in, AutoPlan& a) {
  const PlannerResult optimum = a.best;
  const double slack = 0.02 * (profile.none_step_ms + optimum.time_ms);
  for (const auto& cand : profile.candidates) {
    if (cand.component.empty()) continue;
    PlannerInput one = in;
    bool ok = true;
    for (auto& cs : one.choices) {
      cs.erase(std::remove_if(cs.begin(), cs.end(),
                              [&](const PlanChoice& c) {
                                const std::string base = without_keep_gathered(c.component);
                                return !base.empty() && base != cand.component;
                              }),
               cs.end());
      ok = ok && !cs.empty();
    }
    if (!ok) continue;
    PlannerResult r = solve_plan(one);
    if (!r.feasible || r.time_ms > optimum.time_ms + slack) continue;
    const auto parts = plan_parts(r.plan), best_parts = plan_parts(a.best.plan);
    if (parts < best_parts || (parts == best_parts && r.time_ms < a.best.time_ms && a.best.plan != optimum.plan))
      a.best = r;
  }
  a.optimum = optimum;
}

// Candidate `c` on every block where `in` offers it (keeping everything on
// the others: MoE parts on a dense block), with its prediction; nullopt
// when a block offers neither.
std::optional<PlannerResult> whole_candidate_plan(const PlannerInput& in, const ProfiledCandidate& c) {
  std::vector<std::size_t> pick;
  for (const auto& cs : in.choices) {
    std::size_t idx = cs.size();
    for (std::size_t q = 0; q < cs.size(); ++q)
      if (cs[q].component == c.component) idx = q;
    if (idx == cs.size())  // not offered on this block (MoE parts on a dense block): keep
      for (std::size_t q = 0; q < cs.size(); ++q)
        if (cs[q].component.empty()) idx = q;
    if (idx == cs.size()) return std::nullopt;
    pick.push_back(idx);
  }
  PlannerResult r;
  r.feasible = true;
  r.choice = pick;
  r.peak = predicted_peak(in, pick);
  for (std::size_t i = 0; i < pick.size(); ++i) r.time_ms += in.choices[i][pick[i]].time_ms;
  r.plan = plan_string(in.choices, pick);
  return r;
}

// a.alternatives: each candidate on every block, the solver's answer
// without offload and compression, and the optimum when a simpler plan won,
// those that fit, fastest first, without a.best, at most `max_alternatives`.
void pick_alternatives(const PlanProfile& profile, const PlannerInput& in, bool allow_lossy,
                       std::size_t max_alternatives, AutoPlan& a) {
  std::vector<PlannerResult> alts;
  for (const auto& c : profile.candidates) {
    if (c.lossy && !allow_lossy) continue;
    if (auto r = whole_candidate_plan(in, c); r && r->peak <= a.planned_budget) alts.push_back(*r);
  }
  PlannerInput no_hooks = in;
  drop_hooks(no_hooks);
  bool all = true;
  for (const auto& cs : no_hooks.choices) all = all && !cs.empty();
  if (all)
    if (PlannerResult r = solve_plan(no_hooks); r.feasible) alts.push_back(r);
  if (a.optimum.plan != a.best.plan) alts.push_back(a.optimum);
  std::sort(alts.begin(), alts.end(), [](const PlannerResult& x, const PlannerResult& y) { return x.time_ms < y.time_ms; });
  for (const auto& r : alts) {
    if (a.alternatives.size() >= max_alternatives) break;
    if (r.plan == a.best.plan) continue;
    bool dup = false;
    for (const auto& q : a.alternatives) dup = dup || q.plan == r.plan;
    if (!dup) a.alternatives.push_back(r);
  }
}

}  // namespace

namespace {

// `plan` with chunked_loss added ("none" becomes "chunked_loss").
std::string with_chunked_loss(const std::string& plan) { return plan == "none" ? kChunkedLoss : plan + "+" + kChunkedLoss; }

// The choice for one loss variant (chunked or not): the solver's answer,
// the simpler plan preferred, the alternatives; best.feasible false when
// none fits. Under chunked_loss every plan carries it and its extra time.
AutoPlan choose_for_variant(const PlanProfile& profile, const AutoPlan& base, bool chunked, bool allow_lossy,
                            std::size_t max_alternatives, bool hooks) {
  AutoPlan a = base;
  a.chunked_loss = chunked;
  PlannerInput in = profile.planner_input(a.planned_budget, allow_lossy, chunked);
  if (!hooks) drop_hooks(in);
  a.smallest = smallest_peak_plan(in);
  a.best = solve_plan(in);
  if (a.best.feasible) {
    prefer_simpler_plan(profile, in, a);
    pick_alternatives(profile, in, allow_lossy, max_alternatives, a);
  }
  if (chunked) {
    for (PlannerResult* r : {&a.best, &a.optimum, &a.smallest}) {
      r->plan = with_chunked_loss(r->plan);
      r->time_ms += profile.chunked_loss.extra_ms;
    }
    for (PlannerResult& r : a.alternatives) {
      r.plan = with_chunked_loss(r.plan);
      r.time_ms += profile.chunked_loss.extra_ms;
    }
  }
  a.predicted_step_ms = profile.none_step_ms + a.best.time_ms;
  return a;
}

}  // namespace

AutoPlan choose_plan(const PlanProfile& profile, std::int64_t budget, bool allow_lossy, std::size_t max_alternatives,
                     std::int64_t reserve, bool hooks) {
  AutoPlan base;
  base.budget = budget;
  base.margin = std::max(0.01, profile.peak_spread);
  base.planned_budget = budget - std::int64_t(double(budget) * base.margin) - reserve;
  // The loss unchunked, and chunked when the profile measured it: the one
  // with the least predicted time that fits (unchunked on a tie).
  AutoPlan a = choose_for_variant(profile, base, false, allow_lossy, max_alternatives, hooks);
  if (profile.chunked_loss.measured) {
    AutoPlan c = choose_for_variant(profile, base, true, allow_lossy, max_alternatives, hooks);
    const PlannerResult smallest = c.smallest.peak < a.smallest.peak ? c.smallest : a.smallest;
    if (c.best.feasible && (!a.best.feasible || c.best.time_ms < a.best.time_ms)) a = std::move(c);
    a.smallest = smallest;
  }
  REMAT_CHECK(a.best.feasible, Error, "--memory-budget ", format_mib(budget), " (", budget,
              " bytes): no plan fits (planning for ", format_mib(a.planned_budget),
              ", the budget less a ", 100 * a.margin, "% margin for prediction error and batch-to-batch variation",
              reserve ? " and " + format_mib(reserve) + " a checked run overshot by" : std::string(),
              "); the smallest predicted peak is ",
              format_mib(a.smallest.peak), " (", a.smallest.peak, " bytes), reached by --recompute ", a.smallest.plan,
              allow_lossy ? "" : " (lossless plans only; --allow-lossy adds compression)");
  return a;
}

std::int64_t measure_plan_peak(const ProfileOptions& opts, const std::string& plan, std::int64_t steps) {
  RecomputePlan parsed = RecomputePlan::parse(plan, opts.config.n_layers);
  parsed.offload_dir = opts.offload_dir;
  StepRig rig(opts);
  apply_recompute_plan(rig.model, parsed);
  CachingAllocator& alloc = allocator_for(opts.device);
  // The cache as a fresh process has it: which cached block a request gets
  // (and so its bytes) must not depend on what ran before (offload's thread).
  alloc.empty_cache();
  std::int64_t peak = 0;
  for (std::int64_t step = 0; step < std::max<std::int64_t>(2, steps); ++step) {
    rig.step([&] { alloc.reset_peak(); });
    if (step > 0) peak = std::max(peak, alloc.stats().allocated_peak);
  }
  if (ProcessGroup* job = rig.job()) peak = most_over_ranks(*job, {peak})[0];  // (the fullest rank's)
  return peak;
}

namespace {

// When no choice was seen to fit: the first choice's two fastest
// alternatives (each predicted to fit), then its smallest-peak plan (the
// likeliest to fit), are run in turn, those not run already, and the first
// seen within the budget less the margin is taken. An overshoot is one plan's error, not every plan's: planning
// it away from all of them can leave nothing, when a simpler plan fits.
void check_fallbacks(const PlanProfile& profile, const PlanPeakMeasure& measure, const AutoPlan& first,
                     CheckedPlan& r) {
  std::vector<PlannerResult> order(first.alternatives.begin(),
                                   first.alternatives.begin() + std::ptrdiff_t(std::min<std::size_t>(2, first.alternatives.size())));
  order.push_back(first.smallest);
  for (const PlannerResult& p : order) {
    if (std::any_of(r.history.begin(), r.history.end(), [&](const auto& h) { return h.first == p.plan; })) continue;
    const std::int64_t measured = measure(p.plan);
    r.history.emplace_back(p.plan, measured);
    if (measured > first.planned_budget) continue;
    r.plan = first;
    r.plan.best = p;
    r.plan.predicted_step_ms = profile.none_step_ms + p.time_ms;
    r.measured_peak = measured;
    r.checked = true;
    return;
  }
}

}  // namespace

CheckedPlan choose_checked_plan(const PlanProfile& profile, const ProfileOptions& opts, std::int64_t budget,
                                bool allow_lossy, const PlanPeakMeasure& measure_peak) {
  const PlanPeakMeasure measure =
      measure_peak ? measure_peak : [&opts](const std::string& plan) { return measure_plan_peak(opts, plan); };
  CheckedPlan r;
  AutoPlan first;  // the first choice, with its alternatives and smallest-peak plan
  // The tries: the whole space; then with the overshoot planned away; then
  // without offload and compression (their resident bytes follow I/O timing).
  std::int64_t reserve = 0;
  bool hooks = true;
  for (r.tries = 1; r.tries <= 3; ++r.tries) {
    AutoPlan a;
    try {
      a = choose_plan(profile, budget, allow_lossy, 4, reserve, hooks);
    } catch (const Error&) {
      if (r.tries == 1) throw;
      if (hooks) {  // nothing tighter with the hooks: try without them
        hooks = false;
        reserve = 0;
        continue;
      }
      break;  // keep the last plan (checked = false)
    }
    if (r.tries == 1) first = a;
    const bool seen = std::any_of(r.history.begin(), r.history.end(), [&](const auto& h) { return h.first == a.best.plan; });
    if (!seen) {
      const std::int64_t measured = measure(a.best.plan);
      r.history.emplace_back(a.best.plan, measured);
      r.plan = std::move(a);
      r.measured_peak = measured;
      const std::int64_t limit = r.plan.planned_budget + reserve;  // the budget less the margin
      r.checked = measured <= limit;
      if (r.checked) break;
      if (r.tries == 1) {
        reserve += measured - limit;
        continue;
      }
    }
    if (!hooks) break;
    hooks = false;
    reserve = 0;
  }
  if (!r.checked) check_fallbacks(profile, measure, first, r);
  return r;
}

}  // namespace remat
