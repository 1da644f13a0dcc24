// The measurement processes of ./remat bench: starting one and reading its
// result (the parent's side), and the `bench-worker` process itself, which
// runs untimed warm-up steps, then timed training steps, and prints one
// "BENCH-RESULT {json}" line.
#include "tools/bench_worker.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "checkpoint/checkpoint.h"
#include "checkpoint/plan.h"
#include "checkpoint/time_estimate.h"
#include "cuda/config.h"
#include "cuda/kernel_profiler.h"
#include "engine/autograd.h"
#include "engine/device_runtime.h"
#include "engine/json.h"
#include "engine/op_def.h"
#include "engine/op_hooks.h"
#include "models/decoder.h"
#include "models/recompute.h"
#include "models/tensor_parallel.h"
#include "moe/dispatch.h"
#include "parallel/grad_reducer.h"
#include "tools/args.h"
#include "tools/bench_flops.h"
#include "tools/commands.h"
#include "tools/json.h"
#include "train/data.h"
#include "train/optimizer.h"
#include "train/parallel_layout.h"
#include "train/zero.h"

namespace remat::tools {

std::string run_capture(const std::string& cmd, const char* what, int* rc) {
  FILE* p = ::popen(cmd.c_str(), "r");
  REMAT_CHECK(p != nullptr, Error, "bench: cannot start ", what);
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  *rc = ::pclose(p);
  return out;
}

std::map<std::string, double> run_worker(const std::string& config, const std::string& plan, std::int64_t warmup,
                                         std::int64_t steps, int threads, const std::string& seed,
                                         WorkerRanks ranks, const std::string& dtype,
                                         const std::string& device, const std::string& offload_dir,
                                         const std::string& seq_range) {
  std::string launcher;
  const std::int64_t np = ranks.processes();
  if (np > 1) {
    launcher = "mpirun --oversubscribe " + std::string(::geteuid() == 0 ? "--allow-run-as-root " : "") + "-np " +
               std::to_string(np) + " ";
    threads = std::max<int>(1, threads / int(np));
  }
  const std::int64_t ep = ranks.ep;
  std::string cmd = launcher + "'/proc/" + std::to_string(::getpid()) + "/exe' bench-worker --config '" + config +
                    "' --recompute '" + plan + "' --warmup " + std::to_string(warmup) + " --steps " +
                    std::to_string(steps) + " --threads " + std::to_string(threads) + " --seed " + seed +
                    " --ep " + std::to_string(ep) + " --zero " + std::to_string(ranks.zero) + " --tp " +
                    std::to_string(ranks.tp) + (ranks.sp ? " --sp" : "") + " --dtype " + dtype +
                    " --device " + device +
                    (offload_dir.empty() ? "" : " --offload-dir '" + offload_dir + "'") +
                    (seq_range.empty() ? "" : " --seq-range " + seq_range) + " 2>&1";
  return run_bench_result(cmd, "bench: worker for plan " + plan);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : (v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]));
}

double min_of(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
double max_of(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

std::map<std::string, double> run_bench_result(const std::string& cmd, const std::string& what) {
  int rc = 0;
  const std::string out = run_capture(cmd, what.c_str(), &rc);
  const auto pos = out.find("BENCH-RESULT ");
  REMAT_CHECK(rc == 0 && pos != std::string::npos, Error, what, " failed:\n", out);
  std::string line = out.substr(pos + 13);
  line = line.substr(0, line.find('\n'));
  const Json parsed = Json::parse(line, what + ": its output");
  std::map<std::string, double> r;
  for (const auto& [k, val] : parsed.members()) r[k] = val.as_number();
  return r;
}

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Counts the matrix-product FLOPs of the ops run inside recompute replays,
// from each op's cost in the op table (engine/op_def.h): the matmuls' and
// the fused attention's two products, as model_flops counts them.
class ReplayFlops final : public OpHook {
 public:
  void after(const OpCall& call, const std::vector<Tensor>& /*outputs*/) override {
    if (!in_recompute() || !call.op) return;
    flops += call.op->cost(call).matmul_flops;
  }
  double flops = 0;
};

// The worker's flags.
struct WorkerOptions {
  ModelConfig config;
  std::string plan;
  std::int64_t warmup = 0, steps = 0, ep = 1, zero = 0, tp = 1;
  bool sp = false;
  std::uint64_t seed = 0;
  DType dtype = DType::f32;
  Device device;
  std::optional<std::string> offload_dir;
  std::optional<SeqRange> seq_range;          // a length per batch (config.seq is its max)
  std::optional<std::string> kernel_profile;  // CUDA: each kernel table's GPU time per timed step, to this file
};

WorkerOptions worker_options(const std::vector<std::string>& args) {
  Flags f("bench-worker", "(internal) one measurement process of bench: prints BENCH-RESULT {json}", args,
          {text_flag("config", "model config name or FILE.json", "bench-dense"),
           text_flag("recompute", "one recompute plan", "none"),
           int_flag("warmup", "untimed warm-up steps", 2, {.min = 0}),
           int_flag("steps", "timed steps", 5, {.min = 1}),
           threads_flag_spec(),
           int_flag("seed", "seed", 0, {.min = 0}),
           int_flag("ep", "expert parallel degree (the processes under mpirun)", 1, {.min = 1}),
           int_flag("zero", "ZeRO stage over the processes under mpirun (0: none)", 0, {.min = 0, .max = 3}),
           int_flag("tp", "tensor-parallel degree (innermost ranks of the processes under mpirun)", 1, {.min = 1}),
           bool_flag("sp", "with --tp: sequence parallel"),
           text_flag("dtype", "compute dtype: f32 or bf16", "f32"),
           text_flag("device", "cpu, cuda or cuda:N", "cpu"),
           text_flag("offload-dir", "directory for the offload plans' spill file"),
           text_flag("seq-range", "MIN:MAX[:log]: each step's batch draws its sequence length from the range (the model "
                     "built for MAX)"),
           text_flag("kernel-profile", "on CUDA: write each kernel table's GPU time per timed step, forward and "
                     "backward apart, to FILE (cuda/kernel_profiler.h)")});
  apply_threads_flag(f);
  WorkerOptions o;
  o.config = ModelConfig::load(f.get("config"));
  o.plan = f.get("recompute");
  o.warmup = f.get_int("warmup");
  o.steps = f.get_int("steps");
  o.seed = std::uint64_t(f.get_int("seed"));
  o.device = device_flag(f);
  o.ep = f.get_int("ep");
  o.zero = f.get_int("zero");
  o.tp = f.get_int("tp");
  o.sp = f.get_bool("sp");
  o.dtype = compute_dtype_from_name(f.get("dtype"));
  if (f.has("offload-dir")) o.offload_dir = f.get("offload-dir");
  if (f.has("seq-range")) {
    o.seq_range = parse_seq_range(f.get("seq-range"));
    o.config.seq = o.seq_range->max;
  }
  if (f.has("kernel-profile")) {
    REMAT_CHECK(cuda::kHaveCuda && o.device.is_cuda(), Error, "bench-worker: --kernel-profile times CUDA kernels "
                "(got --device ", o.device.str(), cuda::kHaveCuda ? ")" : " in a build without the CUDA back end)");
    o.kernel_profile = f.get("kernel-profile");
  }
  return o;
}

// The model as the worker measures it: its share of the experts (--ep), the
// compute dtype and the recompute plan, on the device.
void prepare_model(DecoderModel& model, const ParallelLayout& layout, const WorkerOptions& o) {
  model.set_compute_dtype(o.dtype);
  apply_parallel_layout(model, layout, /*reuse_routing_metadata=*/true);
  RecomputePlan parsed = RecomputePlan::parse(o.plan, o.config.n_layers);
  if (o.offload_dir) parsed.offload_dir = *o.offload_dir;
  apply_recompute_plan(model, parsed);
  model.to(o.device);
}

// Each timed step's figures, and the highest peaks over them.
struct WorkerSeries {
  std::vector<double> step_ms, fwd_ms, bwd_ms, replay_flops, replay_wall, offloaded, offload_wait, compressed;
  std::vector<double> estimated_ms;  // the cpu-measured time estimate of each timed step (CPU workers)
  std::vector<double> rss_peak;      // the process's peak resident bytes in each timed step
  std::vector<double> page_cache;    // the spill file's bytes in the page cache after each timed step
  std::vector<double> zero_wait;     // --zero: ms blocked in reduce-scatters and unfinished gathers
  std::vector<double> tokens, model_flops;  // --seq-range: each timed step's global batch tokens and model FLOPs
  std::vector<double> evictions, evicted_bytes, rebuilds, rebuild_ms;  // --recompute dynamic
  std::int64_t peak_alloc = 0, peak_res = 0, persistent = 0, activations = 0, ops = 0, replayed = 0;
  std::int64_t peak_alloc_rank0 = 0;  // several ranks: rank 0's own peak (peak_alloc is the fullest rank's)
  std::int64_t loss = 0;   // the loss category's most (the head's logits and the loss's)
  CommCounters comm_step;  // the last timed step's collectives
};

// Restarts the kernel's count of this process's peak resident set (Linux:
// "5" to /proc/self/clear_refs); rss_peak_bytes() is VmHWM since, 0 where
// it cannot be read.
void reset_rss_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }
std::int64_t rss_peak_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::int64_t(std::strtoll(line.c_str() + 6, nullptr, 10)) * 1024;
  return 0;
}

// The counters a step's figures are differences of, read before it.
struct CounterMarks {
  CommCounters comm;
  std::int64_t ops_recomputed = 0, replay_ns = 0, replay_bytes_moved = 0, zero_wait_ns = 0;
  OffloadStats offload;
  CompressHooks::Stats compress;
  DynamicRematStats dynamic;
};

struct StepTimes {
  double forward_ms = 0, backward_ms = 0, step_ms = 0;
};

// The training steps of one worker process: forward, backward (with the
// gradient all-reduce of --ep's replicated parameters), clipping and AdamW,
// as ./remat train runs them, each step timed and its memory and counters
// recorded.
class WorkerSteps {
 public:
  // `world`: the data-parallel ranks (sharing the batch); `tp`: this rank's
  // tensor-parallel group (null without --tp); `ranks`: the job's processes.
  WorkerSteps(DecoderModel& model, DataParallelUpdate& update, const ParallelLayout& layout, ProcessGroup& world,
              std::shared_ptr<const TensorParallel> tp, int ranks, const WorkerOptions& o)
      : model_(model), update_(update), layout_(layout), world_(world), tp_(std::move(tp)), ranks_(ranks),
        device_(o.device),
        offload_(model.block_stack().offload_hooks()), compress_(model.block_stack().compress_hooks()),
        corpus_(generated_corpus(o.seed, std::int64_t(1) << 20, o.config.seq + 2)),
        sampler_(o.seq_range ? BatchSampler(corpus_.train, o.config.batch, *o.seq_range, o.seed + 1)
                             : BatchSampler(corpus_.train, o.config.batch, o.config.seq, o.seed + 1)),
        ranged_(o.seq_range.has_value()), ep_(o.ep),
        flops_hook_(std::make_shared<ReplayFlops>()), hook_(flops_hook_),
        estimator_(o.device.is_cpu() ? std::make_shared<StepTimeEstimator>(device_model("cpu-measured")) : nullptr),
        estimator_hook_(estimator_ ? std::shared_ptr<OpHook>(estimator_) : std::make_shared<OpHook>()),  // none off the CPU
        alloc_(allocator_for(o.device)) {}

  // One step; its figures go to the series when `timed`.
  void step(bool timed) {
    Tensor batch = sampler_.next();
    seq_ = batch.size(1) - 1;  // (this batch's length: the config's, or drawn from --seq-range)
    batch = batch_shard(batch, world_).to(device_);
    model_.zero_grad();
    update_.zero_shards();
    synchronize(device_);
    const CounterMarks before = mark();
    const StepTimes times = train(batch);
    if (offload_) offload_->check();
    if (timed) record(before, times);
  }

  const WorkerSeries& series() const { return series_; }
  // Several ranks: the peak, persistent and activation bytes become the
  // fullest rank's (what a budget must hold; the planner plans for it too),
  // rank 0's peak kept apart. A collective.
  void take_fullest_rank(ProcessGroup& world) {
    series_.peak_alloc_rank0 = series_.peak_alloc;
    const auto m = most_over_ranks(world, {series_.peak_alloc, series_.peak_res, series_.persistent, series_.activations});
    series_.peak_alloc = m[0];
    series_.peak_res = m[1];
    series_.persistent = m[2];
    series_.activations = m[3];
  }

 private:
  // Reads the counters and resets the allocator's peak and the replay FLOPs.
  // Every group's collectives: the layout's and the tensor-parallel ones.
  CommCounters comm() const {
    CommCounters c = layout_.counters();
    if (tp_) c = c + tp_->group->counters();
    if (tp_ && tp_->kv_group) c = c + tp_->kv_group->counters();
    return c;
  }

  CounterMarks mark() {
    CounterMarks m;
    m.comm = comm();
    alloc_.reset_peak();
    m.ops_recomputed = checkpoint_counters().ops_recomputed;
    m.replay_ns = checkpoint_counters().replay_ns;
    m.replay_bytes_moved = dispatch_counters().replay_bytes_moved;
    flops_hook_->flops = 0;
    if (estimator_) estimator_->reset();
    m.offload = offload_ ? offload_->stats() : OffloadStats{};
    m.compress = compress_ ? compress_->stats() : CompressHooks::Stats{};
    m.dynamic = dynamic_stats();
    m.zero_wait_ns = zero_wait_ns();
    reset_rss_peak();
    return m;
  }

  // --zero: the time blocked in its reduce-scatters (blocking: all exposed)
  // and in gathers that had not finished when their unit was needed; read
  // after the step's zero() of the sharded reducer, which restarts its count.
  std::int64_t zero_wait_ns() {
    if (!update_.zero) return 0;
    std::int64_t ns = update_.zero->gatherer() ? update_.zero->gatherer()->wait_ns() : 0;
    if (const ShardedGradReducer* r = update_.zero->grad_reducer()) ns += r->stats().wait_ns;
    return ns;
  }

  DynamicRematStats dynamic_stats() const {
    const auto& d = model_.block_stack().dynamic_remat();
    return d ? d->stats() : DynamicRematStats{};
  }

  // Forward, backward and the update, timed (the device synchronised).
  StepTimes train(const Tensor& batch) {
    const int W = world_.size();
    StepTimes t;
    const auto t0 = Clock::now();
    Tensor loss;
    RngShardScope shard(world_.rank(), W);
    std::optional<DynamicRematScope> dynamic;  // --recompute dynamic: forward and backward under its budget
    dynamic.emplace(model_.block_stack().dynamic_remat());
    {
      CategoryScope cat(MemoryCategory::activation);
      loss = model_.forward_loss(batch).loss;
      (void)loss.item();
    }
    t.forward_ms = ms_since(t0);
    const auto t1 = Clock::now();
    {
      CategoryScope cat(MemoryCategory::activation);
      update_.backward(loss, 1.0 / double(W));
      synchronize(device_);
    }
    t.backward_ms = ms_since(t1);
    loss = Tensor();
    dynamic.reset();
    update_.step(trainable_tensors(model_), 1.0, 1e-3);  // (under --zero this rank's norm: the figures are times and bytes)
    synchronize(device_);
    t.step_ms = ms_since(t0);
    return t;
  }

  // Appends a timed step's figures (counters taken since `m`).
  void record(const CounterMarks& m, const StepTimes& t) {
    WorkerSeries& s = series_;
    const OffloadStats off1 = offload_ ? offload_->stats() : OffloadStats{};
    s.offloaded.push_back(
        double((off1.bytes_written + off1.bytes_to_host) - (m.offload.bytes_written + m.offload.bytes_to_host)));
    s.offload_wait.push_back(double(off1.wait_ns - m.offload.wait_ns) * 1e-6);
    s.compressed.push_back(compress_ ? double(compress_->stats().compressed_bytes - m.compress.compressed_bytes)
                                     : 0.0);
    const auto st = alloc_.stats();
    s.rss_peak.push_back(double(rss_peak_bytes()));
    s.zero_wait.push_back(double(zero_wait_ns() - m.zero_wait_ns) * 1e-6);
    s.page_cache.push_back(offload_ ? double(offload_->page_cache_bytes()) : 0.0);
    s.step_ms.push_back(t.step_ms);
    const DynamicRematStats d = dynamic_stats();
    s.evictions.push_back(double(d.evictions - m.dynamic.evictions));
    s.evicted_bytes.push_back(double(d.evicted_bytes - m.dynamic.evicted_bytes));
    s.rebuilds.push_back(double(d.rebuilds - m.dynamic.rebuilds));
    s.rebuild_ms.push_back(d.rebuild_ms - m.dynamic.rebuild_ms);
    if (ranged_) {
      s.tokens.push_back(double(model_.config().batch * seq_));
      s.model_flops.push_back(model_flops(model_, ep_, seq_));
    }
    s.fwd_ms.push_back(t.forward_ms);
    s.bwd_ms.push_back(t.backward_ms);
    s.replay_flops.push_back(flops_hook_->flops);
    if (estimator_) {
      estimator_->add_optimizer(model_.num_parameters());
      s.estimated_ms.push_back(estimator_->estimate().total() * 1e3);
    }
    s.replay_wall.push_back(double(checkpoint_counters().replay_ns - m.replay_ns) * 1e-6);
    s.peak_alloc = std::max(s.peak_alloc, st.allocated_peak);
    s.peak_res = std::max(s.peak_res, st.reserved_peak);
    // Persistent: parameters, their gradient buffers and optimizer state
    // (constant from the first step on); activations: the rest of the peak.
    s.persistent = update_.persistent_bytes(model_.named_parameters());
    s.activations = std::max(s.activations, st.allocated_peak - s.persistent);
    s.loss = std::max(s.loss, st.category_peak[std::size_t(MemoryCategory::loss)]);
    s.ops = checkpoint_counters().ops_recomputed - m.ops_recomputed;
    s.replayed = dispatch_counters().replay_bytes_moved - m.replay_bytes_moved;
    s.comm_step = comm() - m.comm;
    // With several ranks: what really crossed between ranks again.
    if (ranks_ > 1) s.replayed = s.comm_step.bytes_in(CommPhase::replay);
  }

  DecoderModel& model_;
  DataParallelUpdate& update_;
  const ParallelLayout& layout_;
  ProcessGroup& world_;
  std::shared_ptr<const TensorParallel> tp_;
  int ranks_;
  Device device_;
  const std::shared_ptr<OffloadHooks>& offload_;
  const std::shared_ptr<CompressHooks>& compress_;
  Corpus corpus_;
  BatchSampler sampler_;
  bool ranged_;            // --seq-range: record each timed step's tokens and model FLOPs
  std::int64_t ep_;
  std::int64_t seq_ = 0;   // the current batch's length
  std::shared_ptr<ReplayFlops> flops_hook_;
  OpHookScope hook_;
  std::shared_ptr<StepTimeEstimator> estimator_;  // observes every op (checkpoint/time_estimate.h)
  OpHookScope estimator_hook_;
  CachingAllocator& alloc_;
  WorkerSeries series_;
};

// The BENCH-RESULT object: per-step figures over the timed steps (medians;
// under --seq-range means, every step's batch having its own length), the
// highest peaks, the FLOPs, and with several ranks rank 0's collectives per
// phase.
JsonObject worker_result(const WorkerSeries& s, const DecoderModel& model, const ParallelLayout& layout, int W,
                         Device device) {
  const ModelConfig& c = model.config();
  // Under --seq-range the median step is the median length's, which hides
  // what the long batches cost; the mean is the run's time over its steps.
  const bool ranged = !s.tokens.empty();
  auto mean = [](const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return v.empty() ? 0.0 : sum / double(v.size());
  };
  auto per_step = [&](const std::vector<double>& v) { return ranged ? mean(v) : median(v); };
  JsonObject j;
  j.set("step_ms", per_step(s.step_ms)).set("forward_ms", per_step(s.fwd_ms)).set("backward_ms", per_step(s.bwd_ms));
  j.set("step_ms_best", ranged ? mean(s.step_ms) : min_of(s.step_ms));  // (ranged: the fastest is the shortest batch)
  j.set("estimated_step_ms", s.estimated_ms.empty() ? 0.0 : per_step(s.estimated_ms));
  // A GEMM peak probe while the cores are warm from the steps: bench keeps the
  // highest figure of all (short bursts of other load lower any one of them).
  if (device.is_cpu()) j.set("gemm_peak_flops", measure_peak_flops(5));
  j.set("replay_wall_ms", per_step(s.replay_wall));
  j.set("offloaded_bytes", per_step(s.offloaded)).set("offload_ms", per_step(s.offload_wait));
  j.set("rss_peak_bytes", median(s.rss_peak)).set("spill_page_cache_bytes", median(s.page_cache));
  j.set("zero_comm_wait_ms", per_step(s.zero_wait));
  j.set("compressed_saved_bytes", per_step(s.compressed));
  if (const auto& d = model.block_stack().dynamic_remat()) {
    j.set("memory_budget_bytes", d->options().budget).set("budget_headroom_bytes", d->options().budget - s.peak_alloc);
    j.set("evictions", per_step(s.evictions)).set("evicted_bytes", per_step(s.evicted_bytes));
    j.set("rebuilds", per_step(s.rebuilds)).set("rebuild_ms", per_step(s.rebuild_ms));
  }
  j.set("peak_allocated_bytes", s.peak_alloc).set("peak_reserved_bytes", s.peak_res);
  if (W > 1) j.set("peak_allocated_bytes_rank0", s.peak_alloc_rank0);
  j.set("persistent_bytes", s.persistent).set("activation_bytes", s.activations).set("loss_bytes", s.loss);
  j.set("recomputed_ops", s.ops).set("replayed_comm_bytes", s.replayed);
  // Rank 0's replayed FLOPs stand for each rank's: times W for the job's.
  // (--seq-range: the means over the timed steps, the same lengths in every worker)
  j.set("model_flops", ranged ? mean(s.model_flops) : model_flops(model, layout.ep));
  j.set("replay_flops", per_step(s.replay_flops) * double(W));
  j.set("tokens", ranged ? mean(s.tokens) : double(c.batch * c.seq));
  if (W > 1) {
    const CommCounters& comm = s.comm_step;
    j.set("ranks", double(W));
    j.set("comm_bytes_forward", double(comm.bytes_in(CommPhase::forward)));
    j.set("comm_bytes_backward", double(comm.bytes_in(CommPhase::backward)));
    j.set("comm_bytes_replay", double(comm.bytes_in(CommPhase::replay)));
    j.set("all_to_all_bytes_forward", double(comm.bytes_of(CollectiveKind::all_to_all, CommPhase::forward)));
    j.set("all_to_all_bytes_replay", double(comm.bytes_of(CollectiveKind::all_to_all, CommPhase::replay)));
    j.set("all_to_all_calls_replay", double(comm.calls_of(CollectiveKind::all_to_all, CommPhase::replay)));
    for (CommPhase p : {CommPhase::forward, CommPhase::backward, CommPhase::replay}) {
      const std::string ph = phase_name(p);
      j.set("all_gather_calls_" + ph, double(comm.calls_of(CollectiveKind::all_gather, p)));
      j.set("all_gather_bytes_" + ph, double(comm.bytes_of(CollectiveKind::all_gather, p)));
    }
    for (CommPhase p : {CommPhase::forward, CommPhase::backward, CommPhase::replay}) {
      const std::string ph = phase_name(p);
      j.set("reduce_scatter_calls_" + ph, double(comm.calls_of(CollectiveKind::reduce_scatter, p)));
      j.set("reduce_scatter_bytes_" + ph, double(comm.bytes_of(CollectiveKind::reduce_scatter, p)));
      j.set("all_reduce_calls_" + ph, double(comm.calls_of(CollectiveKind::all_reduce, p)));
      j.set("all_reduce_bytes_" + ph, double(comm.bytes_of(CollectiveKind::all_reduce, p)));
    }
  }
  return j;
}

// The timed steps under a kernel profile; writes o.kernel_profile: per
// kernel table, its calls and GPU milliseconds per step, then the step's
// median wall time for scale.
void profile_kernels(WorkerSteps& steps, const WorkerOptions& o) {
  cuda::CudaKernelProfiler profiler;
  {
    KernelObserverScope observing(profiler);
    for (std::int64_t i = 0; i < o.steps; ++i) steps.step(/*timed=*/true);
  }
  const std::vector<cuda::KernelTime> times = profiler.collect();
  std::ofstream out(*o.kernel_profile);
  REMAT_CHECK(out.good(), IOError, "bench-worker: cannot write --kernel-profile ", *o.kernel_profile);
  double total = 0;
  out << "# " << o.config.name << " " << o.plan << " on " << o.device.str() << ", per step over " << o.steps
      << " steps: kernel table, calls, GPU ms (less nested tables)\n";
  for (const cuda::KernelTime& k : times) {
    out << k.table << "\t" << double(k.calls) / double(o.steps) << "\t" << k.ms / double(o.steps) << "\n";
    total += k.ms / double(o.steps);
  }
  std::vector<double> wall = steps.series().step_ms;
  std::sort(wall.begin(), wall.end());
  out << "# kernel tables " << total << " ms of a " << wall[wall.size() / 2] << " ms step (median wall)\n";
}

}  // namespace

int run_bench_worker(const std::vector<std::string>& args) {
  const WorkerOptions o = worker_options(args);
  // Several processes (--ep, --dp under mpirun): each rank takes its share
  // of the batch and of the experts, and its shards (--zero), as `./remat
  // train` does.
  // --tp: the innermost ranks split each block, the ranks with the same
  // tensor-parallel rank share the batch (as train --tp).
  auto job = world_group();
  const TensorParallelJob split = split_tensor_parallel(job, o.config, o.tp, o.sp);
  const std::shared_ptr<TensorParallel>& tp = split.tp;
  const std::shared_ptr<ProcessGroup>& world = split.rest;
  const ParallelLayout layout = make_parallel_layout(world, o.ep, o.config);
  manual_seed(o.seed);
  DecoderModel model(o.config, o.seed, layout.placement());
  if (tp) apply_tensor_parallel(model, tp);
  prepare_model(model, layout, o);
  DataParallelUpdate update =
      make_data_parallel_update(layout, model.trainable_parameters(), 25ll << 20, o.zero, {}, model);
  WorkerSteps steps(model, update, layout, *world, tp, job->size(), o);
  for (std::int64_t i = 0; i < o.warmup; ++i) steps.step(/*timed=*/false);
  if (o.kernel_profile) {
    if constexpr (cuda::kHaveCuda) profile_kernels(steps, o);
  } else {
    for (std::int64_t i = 0; i < o.steps; ++i) steps.step(/*timed=*/true);
  }
  if (job->size() > 1) steps.take_fullest_rank(*job);
  if (job->rank() != 0) return 0;  // rank 0 reports
  JsonObject result = worker_result(steps.series(), model, layout, job->size(), o.device);
  if (tp) result.set("tp", double(o.tp)).set("sp", o.sp ? 1.0 : 0.0);
  std::printf("BENCH-RESULT %s\n", result.str().c_str());
  return 0;
}

}  // namespace remat::tools
