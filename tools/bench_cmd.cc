// ./remat bench: each plan x repeat runs in a fresh process (this binary
// re-executed as `bench-worker`), so allocator caches, peaks and warm state
// never leak from one measurement into the next. Workers run warm-up steps
// untimed, then timed training steps, and print one JSON result line; the
// parent reports medians and min-max over repeats, ratios against `none`,
// MFU and HFU.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/plan.h"
#include "engine/autograd.h"
#include "engine/device_runtime.h"
#include "engine/op_def.h"
#include "engine/op_hooks.h"
#include "engine/json.h"
#include "engine/parallel_for.h"
#include "models/decoder.h"
#include "models/recompute.h"
#include "moe/dispatch.h"
#include "ops/gemm.h"
#include "parallel/grad_reducer.h"
#include "tools/args.h"
#include "tools/auto_plan_flags.h"
#include "tools/bench_order.h"
#include "tools/bench_pipeline.h"
#include "tools/bench_worker.h"
#include "tools/bench_plot.h"
#include "tools/html.h"
#include "tools/commands.h"
#include "tools/json.h"
#include "train/data.h"
#include "train/optimizer.h"
#include "train/parallel_layout.h"

namespace remat::tools {

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

// Parameters that do matmul work for each token: everything but the
// embedding table, with routed experts counted at top_k / experts.
// `ep`: the model holds 1/ep of the experts (expert parallel).
double active_params(const DecoderModel& m, std::int64_t ep = 1) {
  const ModelConfig& c = m.config();
  double n = 0;
  for (const auto& [name, p] : m.named_parameters()) {
    if (name == "model.embed_tokens.weight") continue;
    if (name.find(".mlp.experts.") != std::string::npos)
      n += double(p.numel()) * double(c.top_k) * double(ep) / double(c.experts);
    else
      n += double(p.numel());
  }
  return n;
}

// Model FLOPs of one training step (PaLM, Chowdhery et al. 2022, appendix B):
// 6 N per token for the matmuls plus 12 L d S per token for attention.
// The global batch's, also when `m` holds 1/ep of the experts.
double model_flops(const DecoderModel& m, std::int64_t ep = 1) {
  const ModelConfig& c = m.config();
  const double tokens = double(c.batch * c.seq);
  return tokens * (6.0 * active_params(m, ep) + 12.0 * double(c.n_layers) * double(c.d_model) * double(c.seq));
}

// The best of `tries` 1024^3 GEMMs: the machine's practical f32 peak. bench
// measures it (10 tries) before and after its runs, and each CPU worker
// probes it (5 tries) after its timed steps; the highest figure is the
// peak, so a moment of other load cannot lower it (which would inflate MFU).
double measure_peak_flops(int tries = 10) {
  const std::int64_t n = 1024;
  std::vector<float> a(static_cast<std::size_t>(n * n), 1.0f), b(a), c(a);
  double best = 0;
  for (int i = 0; i < tries; ++i) {
    const auto t0 = Clock::now();
    ops_detail::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    best = std::max(best, 2.0 * double(n * n * n) / (ms_since(t0) * 1e-3));
  }
  return best;
}

// A CUDA device's dense peak for the compute dtype. H100/H200 SXM: the
// datasheet figures (989.4 TFLOP/s bf16/f16 tensor-core dense, 66.9 TFLOP/s
// f32); other GPUs: SMs x clock x per-SM rate (Hopper: 4096 16-bit tensor
// FLOPs and 256 f32 FLOPs per SM per clock, from the same figures).
double cuda_peak_flops(Device device, const std::string& dtype) {
  const DeviceInfo info = device_info(device);
  const bool half = dtype != "f32";
  if (info.name.find("H100") != std::string::npos || info.name.find("H200") != std::string::npos)
    return half ? 989.4e12 : 66.9e12;
  return double(info.multiprocessors) * double(info.clock_khz) * 1e3 * (half ? 4096.0 : 256.0);
}

// Waits for the device's queued work (the CPU runs ops synchronously).
void sync(Device device) {
  synchronize(device);
}

// Splits "none,selected:0,2,per_block" into plans: a piece that does not start
// a plan continues the previous one.
std::vector<std::string> split_plans(const std::string& s) {
  // (A piece that starts with none of these continues the previous plan's
  // list: selective:mlp,layernorm, offload:mlp,core_attn.)
  static const char* heads[] = {"none",       "per_block",  "chunk",     "selected:", "uniform:", "block:",
                                "attention",  "moe_expert", "selective:", "keep_last", "offload",  "compress:",
                                "auto"};
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string piece;
  while (std::getline(in, piece, ',')) {
    bool starts = false;
    for (const char* h : heads) starts = starts || piece.rfind(h, 0) == 0;
    if (starts || out.empty())
      out.push_back(piece);
    else
      out.back() += "," + piece;
  }
  return out;
}

// One traced training step of `c` under `plan`: the peak of the activation
// bytes the ops save (saved-tensor registry, persistent state excluded), and
// the peak of all non-persistent bytes (those plus backward's working set of
// gradients and temporaries), from the allocator.
struct Trace {
  double saved = 0;
  double total = 0;
};

Trace trace_step(const ModelConfig& c, const std::string& plan) {
  DecoderModel model(c, 0);
  apply_recompute_plan(model, RecomputePlan::parse(plan, c.n_layers));
  Corpus corpus = generated_corpus(0, std::int64_t(1) << 16, c.seq + 2);
  BatchSampler sampler(corpus.train, c.batch, c.seq, 1);
  auto& alloc = allocator_for(kCPU);
  // Gradient buffers exist from the first step on: allocate them first.
  for (auto& [name, p] : model.named_parameters()) {
    CategoryScope cat(MemoryCategory::gradient);
    p.set_grad(zeros(p.sizes()));
  }
  const std::int64_t base_saved = saved_bytes_report().activation_live_bytes;
  const std::int64_t base_alloc = alloc.stats().allocated_bytes;
  reset_saved_bytes_peak();
  alloc.reset_peak();
  {
    CategoryScope cat(MemoryCategory::activation);
    Tensor loss = model.forward_loss(sampler.next()).loss;
    loss.backward();
  }
  Trace t;
  t.saved = double(saved_bytes_report().activation_peak_bytes - base_saved);
  t.total = double(alloc.stats().allocated_peak - base_alloc);
  return t;
}

}  // namespace

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
                                         std::int64_t ep, const std::string& dtype,
                                         const std::string& device, const std::string& offload_dir) {
  std::string launcher;
  if (ep > 1) {
    launcher = "mpirun --oversubscribe " + std::string(::geteuid() == 0 ? "--allow-run-as-root " : "") + "-np " +
               std::to_string(ep) + " ";
    threads = std::max<int>(1, threads / int(ep));
  }
  std::string cmd = launcher + "'/proc/" + std::to_string(::getpid()) + "/exe' bench-worker --config '" + config +
                    "' --recompute '" + plan + "' --warmup " + std::to_string(warmup) + " --steps " +
                    std::to_string(steps) + " --threads " + std::to_string(threads) + " --seed " + seed +
                    " --ep " + std::to_string(ep) + " --dtype " + dtype + " --device " + device +
                    (offload_dir.empty() ? "" : " --offload-dir '" + offload_dir + "'") + " 2>&1";
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

// ./remat bench --estimate: activation bytes predicted from a traced step at
// batch 1 (what the ops save, plus backward's working set), scaled to the
// batch (both grow linearly with it), next to the allocator's measurement of
// a real step at the full batch.
int run_estimate(const std::string& config, const ModelConfig& c, const std::vector<std::string>& plans,
                 int threads, const std::string& seed, const std::string& json_path) {
  ModelConfig one = c;
  one.batch = 1;
  const double B = double(c.batch);
  const double input_bytes = double(c.batch * c.seq * c.d_model * 4);
  // One block's saves and the rest of the model's, from 1- and 2-block traces.
  ModelConfig l1 = one, l2 = one;
  l1.n_layers = 1;
  l2.n_layers = 2;
  l1.dense_first = l2.dense_first = 0;  // MoE configs: the per-block figure is an MoE block's
  const double p1 = trace_step(l1, "none").saved, p2 = trace_step(l2, "none").saved;
  const double block_saves = (p2 - p1) * B, rest = (p1 - (p2 - p1)) * B;
  std::printf("activation estimate for %s (traced at batch 1, scaled to batch %lld):\n", c.name.c_str(),
              static_cast<long long>(c.batch));
  std::printf("  per block: saved tensors %.2f MiB, block input (a region boundary) %.2f MiB; embedding + head + loss %.2f MiB\n\n",
              block_saves / 1048576.0, input_bytes / 1048576.0, rest / 1048576.0);
  std::printf("%-24s %12s %14s %14s %8s\n", "plan", "saved MiB", "predicted MiB", "measured MiB", "error");
  std::vector<JsonObject> rows;
  for (const auto& plan : plans) {
    const Trace t = trace_step(one, plan);
    const double predicted = t.total * B;
    const auto m = run_worker(config, plan, 1, 1, threads, seed);
    const double measured = m.at("activation_bytes");
    const double err = measured > 0 ? (predicted - measured) / measured : 0.0;
    std::printf("%-24s %12.2f %14.2f %14.2f %7.1f%%\n", plan.c_str(), t.saved * B / 1048576.0, predicted / 1048576.0,
                measured / 1048576.0, 100 * err);
    JsonObject j;
    j.set("plan", plan).set("config", c.name).set("predicted_activation_bytes", predicted);
    j.set("predicted_saved_bytes", t.saved * B);
    j.set("activation_bytes", measured).set("relative_error", err);
    j.set("block_saved_bytes", block_saves).set("block_input_bytes", input_bytes).set("rest_saved_bytes", rest);
    rows.push_back(j);
  }
  std::printf("(measured: peak allocated minus parameters, gradients and optimizer state, one step in a fresh process)\n");
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    REMAT_CHECK(out.good(), IOError, "bench: cannot write ", json_path);
    out << json_array(rows);
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}

}  // namespace

// The worker: one process, one plan, one repeat. Prints "BENCH-RESULT {json}".
int run_bench_worker(const std::vector<std::string>& args) {
  Flags f("bench-worker", "(internal) one measurement process of bench: prints BENCH-RESULT {json}", args,
          {text_flag("config", "model config name or FILE.json", "bench-dense"),
           text_flag("recompute", "one recompute plan", "none"),
           int_flag("warmup", "untimed warm-up steps", 2, {.min = 0}),
           int_flag("steps", "timed steps", 5, {.min = 1}),
           threads_flag_spec(),
           int_flag("seed", "seed", 0, {.min = 0}),
           int_flag("ep", "expert parallel degree (the processes under mpirun)", 1, {.min = 1}),
           text_flag("dtype", "compute dtype: f32 or bf16", "f32"),
           text_flag("device", "cpu, cuda or cuda:N", "cpu"),
           text_flag("offload-dir", "directory for the offload plans' spill file")});
  apply_threads_flag(f);
  const ModelConfig c = ModelConfig::load(f.get("config"));
  const std::string plan = f.get("recompute");
  const std::int64_t warmup = f.get_int("warmup"), steps = f.get_int("steps");
  const auto seed = std::uint64_t(f.get_int("seed"));
  const Device device = device_flag(f);

  // Several processes (--ep under mpirun): each rank takes its share of the
  // batch and of the experts, as `./remat train` does.
  auto world = world_group();
  const int W = world->size();
  const ParallelLayout layout = make_parallel_layout(world, f.get_int("ep"), c);
  manual_seed(seed);
  DecoderModel model(c, seed, layout.placement());
  model.set_compute_dtype(compute_dtype_from_name(f.get("dtype")));
  apply_parallel_layout(model, layout, /*reuse_routing_metadata=*/true);
  RecomputePlan parsed = RecomputePlan::parse(plan, c.n_layers);
  if (f.has("offload-dir")) parsed.offload_dir = f.get("offload-dir");
  apply_recompute_plan(model, parsed);
  model.to(device);
  AdamW opt(model.named_parameters());
  const auto& offload = model.model->blocks->offload_hooks();
  const auto& compress = model.model->blocks->compress_hooks();
  std::unique_ptr<GradReducer> reducer = make_grad_reducer(layout, model.named_parameters(), 25ll << 20);
  CommCounters comm_step;
  Corpus corpus = generated_corpus(seed, std::int64_t(1) << 20, c.seq + 2);
  BatchSampler sampler(corpus.train, c.batch, c.seq, seed + 1);
  auto flops_hook = std::make_shared<ReplayFlops>();
  OpHookScope hook(flops_hook);
  auto& alloc = allocator_for(device);

  std::vector<double> step_ms, fwd_ms, bwd_ms, replay_flops, replay_wall, offloaded, offload_wait, compressed;
  std::int64_t peak_alloc = 0, peak_res = 0, persistent = 0, activations = 0, ops = 0, replayed = 0;
  for (std::int64_t i = 0; i < warmup + steps; ++i) {
    Tensor batch = sampler.next();
    batch = batch_shard(batch, *world).to(device);
    model.zero_grad();
    sync(device);
    const CommCounters comm0 = layout.counters();
    alloc.reset_peak();
    const auto ops0 = checkpoint_counters().ops_recomputed;
    const auto replay_ns0 = checkpoint_counters().replay_ns;
    const auto moved0 = dispatch_counters().replay_bytes_moved;
    flops_hook->flops = 0;
    const OffloadStats off0 = offload ? offload->stats() : OffloadStats{};
    const CompressHooks::Stats comp0 = compress ? compress->stats() : CompressHooks::Stats{};
    const auto t0 = Clock::now();
    Tensor loss;
    RngShardScope shard(world->rank(), W);
    {
      CategoryScope cat(MemoryCategory::activation);
      loss = model.forward_loss(batch).loss;
      (void)loss.item();
    }
    const double f_ms = ms_since(t0);
    const auto t1 = Clock::now();
    {
      CategoryScope cat(MemoryCategory::activation);
      if (reducer) reducer->prepare();
      const TensorOptions seed_opts(loss.dtype(), loss.device());
      loss.backward(W > 1 ? full({}, 1.0 / double(W), seed_opts) : Tensor());
      if (reducer) reducer->finish();
      sync(device);
    }
    const double b_ms = ms_since(t1);
    loss = Tensor();
    clip_grad_norm(model.parameters(), 1.0);
    opt.step(1e-3);
    sync(device);
    const double s_ms = ms_since(t0);
    if (offload) offload->check();
    if (i < warmup) continue;
    const OffloadStats off1 = offload ? offload->stats() : OffloadStats{};
    offloaded.push_back(double((off1.bytes_written + off1.bytes_to_host) - (off0.bytes_written + off0.bytes_to_host)));
    offload_wait.push_back(double(off1.wait_ns - off0.wait_ns) * 1e-6);
    compressed.push_back(compress ? double(compress->stats().compressed_bytes - comp0.compressed_bytes) : 0.0);
    const auto st = alloc.stats();
    step_ms.push_back(s_ms);
    fwd_ms.push_back(f_ms);
    bwd_ms.push_back(b_ms);
    replay_flops.push_back(flops_hook->flops);
    replay_wall.push_back(double(checkpoint_counters().replay_ns - replay_ns0) * 1e-6);
    peak_alloc = std::max(peak_alloc, st.allocated_peak);
    peak_res = std::max(peak_res, st.reserved_peak);
    // Persistent: parameters, their gradient buffers and optimizer state
    // (constant from the first step on); activations: the rest of the peak.
    persistent = persistent_bytes(model.named_parameters(), opt);
    activations = std::max(activations, st.allocated_peak - persistent);
    ops = checkpoint_counters().ops_recomputed - ops0;
    replayed = dispatch_counters().replay_bytes_moved - moved0;
    comm_step = layout.counters() - comm0;
    if (W > 1) replayed = comm_step.bytes_in(CommPhase::replay);  // what really crossed between ranks again
  }
  if (world->rank() != 0) return 0;  // rank 0 reports
  JsonObject j;
  j.set("step_ms", median(step_ms)).set("forward_ms", median(fwd_ms)).set("backward_ms", median(bwd_ms));
  j.set("step_ms_best", min_of(step_ms));
  // A GEMM peak probe while the cores are warm from the steps: bench keeps the
  // highest figure of all (short bursts of other load lower any one of them).
  if (device.is_cpu()) j.set("gemm_peak_flops", measure_peak_flops(5));
  j.set("replay_wall_ms", median(replay_wall));
  j.set("offloaded_bytes", median(offloaded)).set("offload_ms", median(offload_wait));
  j.set("compressed_saved_bytes", median(compressed));
  j.set("peak_allocated_bytes", peak_alloc).set("peak_reserved_bytes", peak_res);
  j.set("persistent_bytes", persistent).set("activation_bytes", activations);
  j.set("recomputed_ops", ops).set("replayed_comm_bytes", replayed);
  // Rank 0's replayed FLOPs stand for each rank's: times W for the job's.
  j.set("model_flops", model_flops(model, layout.ep)).set("replay_flops", median(replay_flops) * double(W));
  j.set("tokens", double(c.batch * c.seq));
  if (W > 1) {
    j.set("ranks", double(W));
    j.set("comm_bytes_forward", double(comm_step.bytes_in(CommPhase::forward)));
    j.set("comm_bytes_backward", double(comm_step.bytes_in(CommPhase::backward)));
    j.set("comm_bytes_replay", double(comm_step.bytes_in(CommPhase::replay)));
    j.set("all_to_all_bytes_forward", double(comm_step.bytes_of(CollectiveKind::all_to_all, CommPhase::forward)));
    j.set("all_to_all_bytes_replay", double(comm_step.bytes_of(CollectiveKind::all_to_all, CommPhase::replay)));
    j.set("all_to_all_calls_replay", double(comm_step.calls_of(CollectiveKind::all_to_all, CommPhase::replay)));
  }
  std::printf("BENCH-RESULT %s\n", j.str().c_str());
  return 0;
}

namespace {

// bench_torch.py: under the current folder (./remat runs from the repository
// root), else next to the binary or one folder above it (the GPU bundle).
std::string find_torch_script() {
  namespace fs = std::filesystem;
  std::vector<fs::path> tried = {fs::current_path() / "tools/reference/bench_torch.py"};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    tried.push_back(exe.parent_path() / "bench_torch.py");
    tried.push_back(exe.parent_path().parent_path() / "bench_torch.py");
  }
  std::string list;
  for (const fs::path& p : tried) {
    if (fs::exists(p, ec)) return p.string();
    list += (list.empty() ? "" : ", ") + p.string();
  }
  throw Error("bench --baseline torch: tools/reference/bench_torch.py not found (looked at " + list +
              "); run bench from the repository root, e.g. ./remat bench");
}

// The config as a JSON file for bench_torch.py, removed when this goes.
class TempConfigFile {
 public:
  explicit TempConfigFile(const ModelConfig& c)
      : path_((std::filesystem::temp_directory_path() / ("remat-bench-" + std::to_string(::getpid()) + ".json")).string()) {
    std::ofstream out(path_);
    out << c.to_json().dump();
    REMAT_CHECK(out.good(), IOError, "bench: cannot write the baseline's config file ", path_);
  }
  ~TempConfigFile() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  TempConfigFile(const TempConfigFile&) = delete;
  TempConfigFile& operator=(const TempConfigFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// One PyTorch eager process (bench_torch.py) with the bench's threads, dtype,
// device, warm-up and timed steps; its numeric result fields.
std::map<std::string, double> run_torch_worker(const std::string& script, const std::string& config_file,
                                               int threads, const std::string& dtype, const std::string& device,
                                               std::int64_t warmup, std::int64_t steps, std::string* framework) {
  const char* py = std::getenv("REMAT_PYTHON");
  const std::string cmd = std::string("'") + (py && *py ? py : "/usr/bin/python3") + "' '" + script + "' --config '" +
                          config_file + "' --threads " + std::to_string(threads) + " --dtype " + dtype +
                          " --device " + device + " --warmup " + std::to_string(warmup) + " --steps " +
                          std::to_string(steps) + " 2>&1";
  int rc = 0;
  const std::string out = run_capture(cmd, "the PyTorch baseline", &rc);
  const auto pos = out.rfind("\n{", out.size() - (out.size() > 1 ? 2 : 0));
  const std::string line = out.substr(pos == std::string::npos ? 0 : pos + 1);
  REMAT_CHECK(rc == 0 && !line.empty() && line[0] == '{', Error, "bench --baseline torch: ", cmd,
              " failed (exit ", rc, "):\n", out);
  const Json parsed = Json::parse(line.substr(0, line.find('\n')), "bench_torch.py output");
  std::map<std::string, double> r;
  for (const auto& [k, val] : parsed.members()) {
    if (val.is_number()) r[k] = val.as_number();
    if (k == "framework" && framework) *framework = val.as_string();
  }
  for (const char* k : {"step_ms", "step_ms_min", "forward_ms", "backward_ms", "tokens"})
    REMAT_CHECK(r.count(k), Error, "bench --baseline torch: bench_torch.py printed no '", k, "':\n", out);
  r["step_ms_best"] = r.at("step_ms_min");  // its fastest timed step, as the workers' step_ms_best
  return r;
}

// bench --pareto's plans: the hand plans, each also with offload where the
// pair is a plan, then auto.
std::vector<std::string> pareto_plans(const ModelConfig& c) {
  std::vector<std::string> hand = {"none", "per_block", "chunk", "uniform:2", "uniform:4"};
  for (std::int64_t n = 1; n < c.n_layers; ++n) hand.push_back("block:" + std::to_string(n));
  for (const char* p : {"attention", "selective:core_attn", "selective:mlp", "selective:save_matmul"}) hand.push_back(p);
  std::vector<std::string> out;
  for (const auto& p : hand) {
    if ((p == "uniform:2" && c.n_layers <= 2) || (p == "uniform:4" && c.n_layers <= 4))
      continue;  // (uniform:N over N or fewer blocks is chunk)
    out.push_back(p);
  }
  const std::size_t n_hand = out.size();
  for (std::size_t i = 0; i < n_hand; ++i) {
    const std::string with = out[i] == "none" ? "offload" : out[i] + "+offload";
    try {
      RecomputePlan::parse(with, c.n_layers);
      out.push_back(with);
    } catch (const Error&) {
    }
  }
  out.push_back("auto");
  return out;
}

}  // namespace

int run_bench(const std::vector<std::string>& args) {
  Flags f("bench", "memory and speed of recompute plans, each repeat in a fresh process, in a balanced interleaved "
          "order", args,
          with_auto_plan_flags({text_flag("config", "model config name or FILE.json", "bench-dense"),
           text_flag("recompute", "comma-separated plans", "none,per_block"),
           int_flag("warmup", "untimed warm-up steps per process", 2, {.min = 0}),
           int_flag("steps", "timed steps per process", 5, {.min = 1}),
           int_flag("repeats", "fresh processes per plan (rounds of the interleaved order)", 3, {.min = 1}),
           threads_flag_spec(),
           int_flag("seed", "seed", 0, {.min = 0}),
           text_flag("dtype", "compute dtype: f32 or bf16 (mixed precision)", "f32"),
           text_flag("device", "cpu, cuda or cuda:N", "cpu"),
           int_flag("ep", "expert parallel: each worker is N processes under mpirun, the experts split over them", 1,
                    {.min = 1}),
           int_flag("pp", "pipeline stages: each worker is N processes under mpirun, one stage each; per-stage "
                    "memory, in-flight micro-batches and bubble for every --pp-schedule x --recompute", 1, {.min = 1}),
           text_flag("pp-schedule", "with --pp: comma-separated schedules", "gpipe,1f1b"),
           int_flag("grad-accum", "with --pp: micro-batches per step", 4, {.min = 1}),
           int_flag("micro-batch", "with --pp: sequences per micro-batch (the batch is this x --grad-accum)", 1,
                    {.min = 1}),
           number_flag("peak-flops", "device peak FLOP/s for MFU (default: the measured f32 GEMM peak on the CPU; on "
                       "CUDA the device's dense peak for the dtype)", std::nullopt, {.min = 0, .min_open = true}),
           text_flag("baseline", "'torch': PyTorch eager on the same model (tools/reference/bench_torch.py) as "
                     "another variant of the same interleaved run"),
           text_flag("json", "write the results to FILE"),
           text_flag("offload-dir", "directory for the offload plans' spill file (default: $TMPDIR or /tmp)"),
           bool_flag("estimate", "predict activation bytes per plan from what the ops save, next to a measured step"),
           text_flag("html", "write a page plotting memory against step time per plan to FILE"),
           bool_flag("pareto", "the hand plans (none, per_block, chunk, uniform:2, uniform:4, block:N for every N, "
                     "attention, selective:core_attn, selective:mlp, selective:save_matmul, and each with offload) and "
                     "auto at every --memory-budget (default 25%,50%,75%; a comma list), with the planner's table and "
                     "the frontier in --html")}));
  const std::string config = f.get("config");
  const ModelConfig c = ModelConfig::load(config);
  if (f.get_int("pp") > 1) {
    for (const char* other : {"ep", "baseline", "estimate", "pareto", "html", "memory-budget", "offload-dir"})
      REMAT_CHECK(!f.has(other), Error, "bench --pp: --", other, " is not measured with a pipeline");
    REMAT_CHECK(f.get("device") == "cpu", Error, "bench --pp: pipelines run on the CPU under MPI for now");
    apply_threads_flag(f);
    PipelineBenchSpec spec;
    spec.config = config;
    {
      std::stringstream in(f.get("pp-schedule"));
      for (std::string sc; std::getline(in, sc, ',');) spec.schedules.push_back(sc);
    }
    spec.plans = split_plans(f.get("recompute"));
    for (const auto& p : spec.plans) RecomputePlan::parse(p, c.n_layers);  // bad plans before any run
    spec.pp = f.get_int("pp");
    spec.micro_batches = f.get_int("grad-accum");
    spec.micro_rows = f.get_int("micro-batch");
    spec.warmup = f.get_int("warmup");
    spec.steps = f.get_int("steps");
    spec.repeats = f.get_int("repeats");
    spec.threads = num_threads();
    spec.seed = f.get("seed");
    spec.dtype = f.get("dtype");
    spec.json_path = f.has("json") ? f.get("json") : "";
    return run_pipeline_bench(spec);
  }
  for (const char* pp_only : {"pp-schedule", "grad-accum", "micro-batch"})
    REMAT_CHECK(!f.has(pp_only), Error, "bench: --", pp_only, " needs --pp P (P >= 2)");
  const bool pareto = f.get_bool("pareto");
  std::vector<std::string> plans =
      pareto && !f.has("recompute") ? pareto_plans(c) : split_plans(f.get("recompute"));
  for (const auto& p : plans)
    if (p != "auto") RecomputePlan::parse(p, c.n_layers);  // reject bad plans before any run
  // `auto` rows: one per budget ("auto" for one budget, "auto 50%" for several).
  std::vector<std::string> budgets;
  {
    std::stringstream in(f.has("memory-budget") ? f.get("memory-budget") : pareto ? "25%,50%,75%" : "");
    for (std::string b; std::getline(in, b, ',');)
      if (!b.empty()) budgets.push_back(b);
  }
  const bool has_auto = std::find(plans.begin(), plans.end(), "auto") != plans.end();
  REMAT_CHECK(!has_auto || f.get_int("ep") == 1, Error, "bench: plan auto profiles one process; with --ep ",
              f.get_int("ep"), " choose the plan with ./remat plan first and bench it by name");
  REMAT_CHECK(!has_auto || !budgets.empty(), Error, "bench: plan auto needs --memory-budget B (one or a comma list)");
  REMAT_CHECK(has_auto || !f.has("memory-budget"), Error, "bench: --memory-budget ", f.get("memory-budget"),
              " needs auto among the --recompute plans");
  const std::int64_t repeats = f.get_int("repeats"), warmup = f.get_int("warmup"), steps = f.get_int("steps");
  apply_threads_flag(f);
  const int threads = num_threads();
  const std::int64_t ep = f.get_int("ep");
  const std::string dtype = f.get("dtype");
  compute_dtype_from_name(dtype);  // reject a bad --dtype before any run
  const Device device = device_flag(f);
  REMAT_CHECK(device.is_cpu() || device.index < cuda_device_count(), DeviceError, "bench: --device ",
              device.str(), ": ", cuda_device_count(), " CUDA devices present",
              cuda_built() ? "" : " (this build has no CUDA back end)");
  REMAT_CHECK(device.is_cpu() || ep == 1, Error, "bench: --ep with --device cuda needs the NCCL back end in the "
              "trainer, which is not wired yet; use --ep on the CPU");
  REMAT_CHECK(ep == 1 || (c.experts % ep == 0 && c.batch % ep == 0), Error, "bench: --ep ", ep, " needs the ",
              c.experts, " experts and the batch of ", c.batch, " to divide by it");
  REMAT_CHECK(!f.get_bool("estimate") || (device.is_cpu() && dtype == "f32"), Error,
              "bench: --estimate traces f32 steps on the CPU; drop --device and --dtype for it");
  const std::string baseline = f.get("baseline");
  REMAT_CHECK(baseline.empty() || baseline == "torch", Error, "bench: --baseline expects 'torch', got '", baseline,
              "'");
  const bool torch = baseline == "torch";
  REMAT_CHECK(!torch || (c.experts == 0 && c.dropout == 0 && ep == 1 && dtype != "f16" &&
                         !f.get_bool("estimate")),
              Error, "bench --baseline torch: the PyTorch baseline models the dense decoder without dropout in f32 "
              "or bf16 on one process; config ", c.name, " has ", c.experts, " experts and dropout ", c.dropout,
              ", --dtype ", dtype, ", --ep ", ep, f.get_bool("estimate") ? ", --estimate" : "");
  if (f.get_bool("estimate")) return run_estimate(config, c, plans, threads, f.get("seed"), f.get("json"));
  const std::string torch_script = torch ? find_torch_script() : "";
  const std::optional<TempConfigFile> torch_config =
      torch ? std::optional<TempConfigFile>(std::in_place, c) : std::nullopt;
  const bool measured_peak = !f.has("peak-flops") && !device.is_cuda();
  double peak = f.has("peak-flops") ? f.get_double("peak-flops")
                : device.is_cuda()   ? cuda_peak_flops(device, dtype)
                                     : measure_peak_flops();

  // auto: one profile (in this process, before any worker), one choice per budget.
  struct AutoRow {
    std::string budget_text;
    AutoPlan choice;
  };
  std::map<std::size_t, AutoRow> autos;  // plan index -> its choice
  std::vector<std::string> run_plans;    // what each plan's workers run
  if (has_auto) {
    std::printf("remat bench: profiling %s for --recompute auto (%lld rounds of each plan component)\n", c.name.c_str(),
                static_cast<long long>(f.get_int("profile-rounds")));
    std::fflush(stdout);
    const ProfileOptions popts =
        profile_options_for_flags(f, c, dtype, device, std::uint64_t(f.get_int("seed")), false);
    const PlanProfile prof = profile_plans(popts);
    std::vector<std::string> named;
    for (const auto& p : plans) {
      if (p != "auto") {
        named.push_back(p);
        run_plans.push_back(p);
        continue;
      }
      for (const auto& b : budgets) {
        std::optional<CheckedPlan> maybe;
        try {
          maybe = checked_choice(f, prof, popts, b);
        } catch (const Error& e) {
          if (!pareto) throw;
          // --pareto: a budget no plan reaches is a finding, not a failure.
          std::printf("  auto %-6s skipped: %s\n", b.c_str(), e.what());
          continue;
        }
        const CheckedPlan& checked = *maybe;
        const AutoPlan& a = checked.plan;
        autos[named.size()] = {b, a};
        named.push_back(budgets.size() == 1 ? "auto" : "auto " + b);
        run_plans.push_back(a.best.plan);
        std::printf("  %-10s budget %-6s = %s: %s (predicted peak %s, a checking run %s; step %.0f ms)\n",
                    named.back().c_str(), b.c_str(), format_mib(a.budget).c_str(), a.best.plan.c_str(),
                    format_mib(a.best.peak).c_str(), format_mib(checked.measured_peak).c_str(), a.predicted_step_ms);
      }
    }
    std::printf("  (profile: %zu components in %.0f s)\n", prof.candidates.size(), prof.seconds);
    plans = named;
  } else {
    run_plans = plans;
  }

  // The variants: the plans, then the baseline; run in a balanced order.
  std::vector<std::string> variants = plans;
  if (torch) variants.push_back("torch");
  const std::int64_t V = std::int64_t(variants.size());
  const auto order = bench_order(V, repeats);
  std::printf("remat bench: config %s on %s, %d threads, %lld repeats x (%lld warm-up + %lld timed steps), peak %.1f "
              "GFLOP/s%s; %zu processes in a balanced interleaved order\n",
              c.name.c_str(), device.str().c_str(), threads, static_cast<long long>(repeats),
              static_cast<long long>(warmup), static_cast<long long>(steps), peak / 1e9,
              f.has("peak-flops") ? "" : device.is_cuda() ? " (device dense peak)" : " (measured GEMM)", order.size());
  std::fflush(stdout);

  std::vector<std::map<std::string, std::vector<double>>> v(static_cast<std::size_t>(V));
  std::vector<JsonObject> runs;
  std::string framework;
  for (const BenchSlot& s : order) {
    const std::string& name = variants[std::size_t(s.variant)];
    const bool is_torch = torch && s.variant == V - 1;
    const auto r = is_torch ? run_torch_worker(torch_script, torch_config->path(), threads, dtype, device.str(),
                                               warmup, steps, &framework)
                            : run_worker(config, run_plans[std::size_t(s.variant)], warmup, steps, threads,
                                         f.get("seed"), ep, dtype, device.str(),
                                         f.has("offload-dir") ? f.get("offload-dir") : "");
    for (const auto& [k, val] : r) v[std::size_t(s.variant)][k].push_back(val);
    JsonObject run;
    run.set("variant", name).set("repeat", s.repeat).set("position", s.position).set("slot", s.slot);
    for (const char* k : {"step_ms", "step_ms_best", "forward_ms", "backward_ms", "peak_allocated_bytes",
                          "peak_reserved_bytes", "activation_bytes"})
      if (r.count(k) && !(is_torch && device.is_cpu() && std::string(k).find("bytes") != std::string::npos))
        run.set(k, r.at(k));  // (PyTorch reports no CPU memory peaks)
    runs.push_back(run);
    std::printf("  [%2lld/%zu] %-24s repeat %lld: step %.0f ms (forward %.0f, backward %.0f)\n",
                static_cast<long long>(s.position + 1), order.size(), name.c_str(),
                static_cast<long long>(s.repeat + 1), r.at("step_ms"), r.at("forward_ms"), r.at("backward_ms"));
    std::fflush(stdout);
  }

  if (measured_peak) {
    double after = measure_peak_flops();
    for (const auto& var : v)
      if (var.count("gemm_peak_flops"))
        for (double p : var.at("gemm_peak_flops")) after = std::max(after, p);
    if (after > peak)
      std::printf("(GEMM peak measured again after the runs and in every worker: %.1f GFLOP/s, used for MFU)\n",
                  after / 1e9);
    peak = std::max(peak, after);
  }

  // The baseline for ratios: `none` if measured, else the first plan. Replay
  // cost: a plan's backward minus the baseline's, also in baseline forwards.
  std::size_t base = 0;
  for (std::size_t i = 0; i < plans.size(); ++i)
    if (plans[i] == "none") base = i;
  auto med_of = [&](std::size_t i, const char* k) { return median(v[i].at(k)); };
  const double base_ms = med_of(base, "step_ms"), base_act = med_of(base, "activation_bytes");
  const double base_bwd = med_of(base, "backward_ms"), base_fwd = med_of(base, "forward_ms");
  const std::size_t ti = std::size_t(V - 1);
  const double torch_tps = torch ? med_of(ti, "tokens") / (med_of(ti, "step_ms") * 1e-3) : 0.0;
  // The best-step view: each process's fastest timed step, median over
  // repeats. Other load only ever slows a step, so on a shared machine the
  // fastest step is the least disturbed estimate of a variant's own time
  // (the minimum as the robust estimator under additive delays: Chen and
  // Revels, "Robust benchmarking in noisy environments", 2016).
  const double base_best = med_of(base, "step_ms_best"), torch_best = torch ? med_of(ti, "step_ms_best") : 0.0;

  std::vector<JsonObject> rows;
  std::vector<BenchPoint> points;
  std::printf("\n%-20s %9s %9s %22s %8s %8s %8s %7s %8s %6s %6s %8s %7s %7s%s\n", "plan", "peak MiB", "activ.",
              "step ms [min-max]", "fwd ms", "bwd ms", "replay", "rep/fwd", "tok/s", "MFU", "HFU", "recomp.", "x time",
              "x mem", torch ? "  x torch" : "");
  for (std::size_t i = 0; i < plans.size(); ++i) {
    auto med = [&](const char* k) { return med_of(i, k); };
    const std::string& plan = plans[i];
    const auto& sv = v[i].at("step_ms");
    const double step = med("step_ms"), tps = med("tokens") / (step * 1e-3);
    const double mfu = med("model_flops") / (step * 1e-3) / peak;
    const double hfu = (med("model_flops") + med("replay_flops")) / (step * 1e-3) / peak;
    const double replay_ms = med("backward_ms") - base_bwd;
    const double replay_fwd = base_fwd > 0 ? replay_ms / base_fwd : 0.0;
    const double mem_ratio = base_act > 0 ? med("activation_bytes") / base_act : 0.0;
    JsonObject j;
    j.set("plan", plan).set("config", c.name).set("repeats", repeats).set("threads", threads).set("dtype", dtype);
    j.set("device", device.str());
    j.set("peak_allocated_bytes", med("peak_allocated_bytes")).set("peak_reserved_bytes", med("peak_reserved_bytes"));
    j.set("persistent_bytes", med("persistent_bytes")).set("activation_bytes", med("activation_bytes"));
    j.set("step_ms", step).set("step_ms_min", min_of(sv)).set("step_ms_max", max_of(sv));
    j.set("forward_ms", med("forward_ms")).set("forward_ms_min", min_of(v[i].at("forward_ms")));
    j.set("forward_ms_max", max_of(v[i].at("forward_ms")));
    j.set("backward_ms", med("backward_ms")).set("backward_ms_min", min_of(v[i].at("backward_ms")));
    j.set("backward_ms_max", max_of(v[i].at("backward_ms")));
    j.set("replay_ms", replay_ms).set("replay_forwards", replay_fwd).set("replay_wall_ms", med("replay_wall_ms"));
    j.set("tokens_per_s", tps).set("recomputed_ops", med("recomputed_ops"));
    j.set("replayed_comm_bytes", med("replayed_comm_bytes")).set("mfu", mfu).set("hfu", hfu);
    j.set("offloaded_bytes", med("offloaded_bytes")).set("offload_ms", med("offload_ms"));
    j.set("compressed_saved_bytes", med("compressed_saved_bytes"));
    j.set("model_flops", med("model_flops")).set("recomputed_flops", med("replay_flops")).set("peak_flops", peak);
    j.set("time_ratio", step / base_ms).set("memory_ratio", mem_ratio);
    if (torch) j.set("torch_ratio", tps / torch_tps);
    j.set("step_ms_best", med("step_ms_best")).set("time_ratio_best", med("step_ms_best") / base_best);
    if (torch) j.set("torch_ratio_best", torch_best / med("step_ms_best"));  // equal tokens per step
    if (autos.count(i)) {
      const AutoPlan& a = autos.at(i).choice;
      j.set("chosen_plan", a.best.plan).set("memory_budget", autos.at(i).budget_text).set("budget_bytes", a.budget);
      j.set("predicted_peak_bytes", a.best.peak).set("predicted_step_ms", a.predicted_step_ms);
    }
    if (ep > 1) {
      j.set("ep", ep);
      for (const char* k : {"comm_bytes_forward", "comm_bytes_backward", "comm_bytes_replay", "all_to_all_bytes_forward",
                            "all_to_all_bytes_replay", "all_to_all_calls_replay"})
        j.set(k, med(k));
    }
    rows.push_back(j);
    BenchPoint bp;
    bp.plan = plan;
    bp.step_ms = step;
    bp.step_ms_min = min_of(sv);
    bp.step_ms_max = max_of(sv);
    bp.activation_bytes = med("activation_bytes");
    bp.peak_allocated_bytes = med("peak_allocated_bytes");
    bp.mfu = mfu;
    bp.hfu = hfu;
    bp.time_ratio = step / base_ms;
    bp.memory_ratio = mem_ratio;
    if (autos.count(i)) {
      const AutoPlan& a = autos.at(i).choice;
      bp.is_auto = true;
      bp.chosen_plan = a.best.plan;
      bp.budget_bytes = double(a.budget);
      bp.predicted_peak_bytes = double(a.best.peak);
      bp.predicted_step_ms = a.predicted_step_ms;
    }
    points.push_back(bp);
    const std::string spread = fmt("%.0f [%.0f-%.0f]", step, min_of(sv), max_of(sv));
    std::printf("%-20s %9.1f %9.1f %22s %8.0f %8.0f %8.0f %7.2f %8.0f %5.1f%% %5.1f%% %8.0f %6.2fx %6.2fx%s\n",
                plan.c_str(), med("peak_allocated_bytes") / 1048576.0, med("activation_bytes") / 1048576.0,
                spread.c_str(), med("forward_ms"), med("backward_ms"), replay_ms, replay_fwd, tps, 100 * mfu,
                100 * hfu, med("recomputed_ops"), step / base_ms, mem_ratio,
                torch ? fmt("  %6.2fx", tps / torch_tps).c_str() : "");
  }
  JsonObject torch_row;
  if (torch) {
    const auto& sv = v[ti].at("step_ms");
    const double step = med_of(ti, "step_ms");
    const std::string spread = fmt("%.0f [%.0f-%.0f]", step, min_of(sv), max_of(sv));
    std::printf("%-20s %9s %9s %22s %8.0f %8.0f %8s %7s %8.0f %5.1f%%\n", "torch", "-", "-", spread.c_str(),
                med_of(ti, "forward_ms"), med_of(ti, "backward_ms"), "-", "-", torch_tps,
                100 * (med_of(base, "model_flops") / (step * 1e-3) / peak));
    torch_row.set("framework", framework).set("step_ms", step).set("step_ms_min", min_of(sv));
    torch_row.set("step_ms_max", max_of(sv)).set("forward_ms", med_of(ti, "forward_ms"));
    torch_row.set("backward_ms", med_of(ti, "backward_ms")).set("tokens_per_s", torch_tps);
    torch_row.set("mfu", med_of(base, "model_flops") / (step * 1e-3) / peak);
    torch_row.set("step_ms_best", torch_best);
  }
  std::printf("(medians over repeats, [min-max] across them; activations = peak - persistent (parameters + gradients "
              "+ optimizer state); replay = backward - %s's backward, rep/fwd in %s forwards; ratios against %s%s)\n",
              plans[base].c_str(), plans[base].c_str(), plans[base].c_str(),
              torch ? fmt("; x torch: tokens/s over %s's", framework.c_str()).c_str() : "");
  std::printf("\n%-24s %14s %8s%s\n", "best step", "ms [min-max]", "x time", torch ? "  x torch" : "");
  for (std::size_t i = 0; i < std::size_t(V); ++i) {
    const bool is_torch = torch && i == ti;
    const auto& bv = v[i].at("step_ms_best");
    const double b = median(bv);
    std::printf("%-24s %14s %8s%s\n", variants[i].c_str(),
                fmt("%.0f [%.0f-%.0f]", b, min_of(bv), max_of(bv)).c_str(),
                is_torch ? "-" : fmt("%.2fx", b / base_best).c_str(),
                !torch ? "" : is_torch ? "        -" : fmt("  %6.2fx", torch_best / b).c_str());
  }
  std::printf("(each process's fastest timed step, median [min-max] over repeats: other load only slows steps, so on "
              "a shared machine this is the least disturbed figure)\n");
  // The planner's rows: each against the fastest other (hand) plan whose
  // measured peak fits the same budget.
  std::vector<JsonObject> auto_rows;
  if (!autos.empty()) {
    std::printf("\n%-12s %10s %-40s %9s %9s %8s %8s %5s  %-26s %8s %7s  %-26s %8s\n", "planner", "budget MiB",
                "chosen plan", "pred. MiB", "meas. MiB", "pred. ms", "meas. ms", "fits", "fastest hand plan that fits",
                "its ms", "x time", "best step: fastest that fits", "x time");
    for (const auto& [i, ar] : autos) {
      const AutoPlan& a = ar.choice;
      const double mp = med_of(i, "peak_allocated_bytes"), ms = med_of(i, "step_ms");
      // The fastest hand plan whose measured peak fits, by the median step
      // and in the best-step view (each process's fastest step, median over
      // repeats); plans.size() if none fits.
      auto fastest_fitting = [&](const char* key) {
        std::size_t best = plans.size();
        for (std::size_t k = 0; k < plans.size(); ++k)
          if (!autos.count(k) && med_of(k, "peak_allocated_bytes") <= double(a.budget) &&
              (best == plans.size() || med_of(k, key) < med_of(best, key)))
            best = k;
        return best;
      };
      const std::size_t best = fastest_fitting("step_ms"), best_b = fastest_fitting("step_ms_best");
      const bool any = best < plans.size();
      const double hand_ms = any ? med_of(best, "step_ms") : 0.0;
      const double ms_b = med_of(i, "step_ms_best"), hand_b = any ? med_of(best_b, "step_ms_best") : 0.0;
      std::printf("%-12s %10.1f %-40s %9.1f %9.1f %8.0f %8.0f %5s  %-26s %8s %7s  %-26s %8s\n", plans[i].c_str(),
                  double(a.budget) / 1048576.0, a.best.plan.c_str(), double(a.best.peak) / 1048576.0, mp / 1048576.0,
                  a.predicted_step_ms, ms, mp <= double(a.budget) ? "yes" : "NO", any ? plans[best].c_str() : "-",
                  any ? fmt("%.0f", hand_ms).c_str() : "-", any ? fmt("%.3fx", ms / hand_ms).c_str() : "-",
                  any ? plans[best_b].c_str() : "-", any ? fmt("%.3fx", ms_b / hand_b).c_str() : "-");
      JsonObject j;
      j.set("row", plans[i]).set("memory_budget", ar.budget_text).set("budget_bytes", a.budget);
      j.set("chosen_plan", a.best.plan).set("predicted_peak_bytes", a.best.peak);
      j.set("peak_allocated_bytes", mp).set("predicted_step_ms", a.predicted_step_ms).set("step_ms", ms);
      j.set("peak_error", (double(a.best.peak) - mp) / mp).set("step_error", (a.predicted_step_ms - ms) / ms);
      j.set("fits", mp <= double(a.budget));
      if (any) j.set("best_hand_plan", plans[best]).set("best_hand_step_ms", hand_ms).set("time_vs_best_hand", ms / hand_ms);
      j.set("step_ms_best", ms_b);
      if (any)
        j.set("best_hand_plan_best", plans[best_b]).set("best_hand_step_ms_best", hand_b)
            .set("time_vs_best_hand_best", ms_b / hand_b);
      auto_rows.push_back(j);
    }
    std::printf("(fits: measured peak <= budget; x time: the auto row's step over the fastest hand plan whose measured "
                "peak fits the same budget, both medians of this run; then the same in the best-step view)\n");
  }
  if (ep > 1) {
    std::printf("\n%d ranks (expert parallel %lld), rank 0's collectives per step, MiB sent:\n%-24s %10s %10s %10s %12s %12s\n",
                int(ep), static_cast<long long>(ep), "plan", "forward", "backward", "replay", "a2a forward",
                "a2a replay");
    for (std::size_t i = 0; i < plans.size(); ++i) {
      auto med = [&](const char* k) { return med_of(i, k) / 1048576.0; };
      std::printf("%-24s %10.2f %10.2f %10.2f %12.2f %12.2f\n", plans[i].c_str(), med("comm_bytes_forward"),
                  med("comm_bytes_backward"), med("comm_bytes_replay"), med("all_to_all_bytes_forward"),
                  med("all_to_all_bytes_replay"));
    }
  }
  if (f.has("json")) {
    const std::string path = f.get("json");
    JsonObject doc;
    doc.set("config", c.name).set("device", device.str()).set("dtype", dtype).set("threads", threads);
    doc.set("repeats", repeats).set("warmup", warmup).set("steps", steps).set("order", "williams");
    doc.set("baseline_plan", plans[base]).set("peak_flops", peak);
    doc.set_raw("rows", json_array(rows));
    if (torch) doc.set_raw("torch", torch_row.str());
    doc.set_raw("runs", json_array(runs));
    if (!auto_rows.empty()) doc.set_raw("auto", json_array(auto_rows));
    std::ofstream out(path);
    REMAT_CHECK(out.good(), IOError, "bench: cannot write ", path);
    out << doc.str() << "\n";
    std::printf("wrote %s\n", path.c_str());
  }
  if (f.has("html")) {
    const std::string path = f.get("html");
    std::ofstream out(path);
    REMAT_CHECK(out.good(), IOError, "bench: cannot write ", path);
    out << bench_html(c.name, fmt("%d threads, %lld fresh processes per plan x %lld timed steps, interleaved; ratios "
                                  "against %s", threads, static_cast<long long>(repeats),
                                  static_cast<long long>(steps), plans[base].c_str()),
                      points);
    std::printf("wrote %s\n", path.c_str());
  }
  return 0;
}

}  // namespace remat::tools
