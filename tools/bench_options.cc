#include "tools/bench_options.h"

#include "models/tensor_parallel.h"

#include <algorithm>
#include <sstream>

#include "checkpoint/plan.h"
#include "engine/device_runtime.h"
#include "engine/error.h"
#include "engine/parallel_for.h"
#include "models/decoder.h"
#include "checkpoint/time_estimate.h"
#include "tools/auto_plan_flags.h"

namespace remat::tools {

std::vector<FlagSpec> bench_flag_specs() {
  return with_auto_plan_flags(
      {text_flag("config", "model config name or FILE.json", "bench-dense"),
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
       int_flag("dp", "data parallel: each worker is N processes under mpirun, each with 1/N of the batch (--ep "
                "divides it)", 1, {.min = 1}),
       int_flag("zero", "with --dp: ZeRO stage over the worker's processes (1 optimizer state, 2 and gradients, 3 "
                "and parameters); per-rank persistent, activation and peak bytes, gathers and reduce-scatters per "
                "phase", 0, {.min = 0, .max = 3}),
       text_flag("tp", "tensor-parallel layouts, comma-separated: T (each worker T x --dp processes under mpirun, "
                 "every block split over T) or T+sp (sequence parallel too), e.g. 1,2,2+sp,4,4+sp; every plan "
                 "runs under each, interleaved; per-rank activation bytes and collectives per phase", "1"),
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
       text_flag("seq-range", "MIN:MAX[:log]: each step's batch draws its sequence length from [MIN, MAX], uniformly "
                 "or (:log) with P(S) ~ 1/S, the "
                 "same lengths for every plan (from --seed); the model is built for MAX"),
       bool_flag("estimate", "predict activation bytes per plan from what the ops save, next to a measured step"),
       text_flag("html", "write a page plotting memory against step time per plan to FILE"),
       bool_flag("pareto", "the hand plans (none, per_block, chunk, uniform:2, uniform:4, block:N for every N, "
                 "attention, selective:core_attn, selective:mlp, selective:save_matmul, and each with offload) and "
                 "auto at every --memory-budget (default 25%,50%,75%; a comma list), with the planner's table and "
                 "the frontier in --html")});
}

std::vector<std::string> split_plans(const std::string& s) {
  // (A piece that starts with none of these continues the previous plan's
  // list: selective:mlp,layernorm, offload:mlp,core_attn.)
  static const char* heads[] = {"none",       "per_block",  "chunk",     "selected:", "uniform:", "block:",
                                "attention",  "moe_expert", "selective:", "keep_last", "offload",  "compress:",
                                "chunked_loss", "keep_gathered", "dynamic",  "auto"};
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

std::vector<std::string> pareto_plans(const ModelConfig& c, std::int64_t zero) {
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
  if (zero == 3) {  // keep_gathered on every block and on the later half, alone and with per_block
    const std::string half = "keep_gathered@" + std::to_string(c.n_layers / 2) + "-" + std::to_string(c.n_layers - 1);
    for (const std::string& k : {std::string("keep_gathered"), half}) {
      out.push_back(k);
      out.push_back("per_block+" + k);
    }
  }
  out.push_back("auto");
  return out;
}

namespace {

// The items of a comma list, empty ones dropped when `skip_empty`.
std::vector<std::string> comma_items(const std::string& s, bool skip_empty) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!skip_empty || !item.empty()) out.push_back(item);
  return out;
}

// The plans and budgets: --recompute's (or --pareto's) plans, each but auto
// parsed; auto needs budgets, budgets need auto.
void plans_and_budgets(const Flags& f, const ModelConfig& c, BenchOptions& o) {
  o.pareto = f.get_bool("pareto");
  o.plans = o.pareto && !f.has("recompute") ? pareto_plans(c, f.get_int("zero")) : split_plans(f.get("recompute"));
  for (const auto& p : o.plans)
    if (p != "auto") {
      const RecomputePlan plan = RecomputePlan::parse(p, c.n_layers);  // reject bad plans before any run
      o.has_dynamic = o.has_dynamic || (plan.dynamic && plan.dynamic_budget == 0);
    }
  o.budgets = comma_items(f.has("memory-budget") ? f.get("memory-budget") : o.pareto ? "25%,50%,75%" : "", true);
  o.has_auto = std::find(o.plans.begin(), o.plans.end(), "auto") != o.plans.end();
  REMAT_CHECK(!(o.has_auto || o.has_dynamic) || !o.budgets.empty(), Error,
              "bench: plans auto and dynamic need --memory-budget B (one or a comma list)");
  REMAT_CHECK(o.has_auto || o.has_dynamic || !f.has("memory-budget"), Error, "bench: --memory-budget ",
              f.get("memory-budget"), " needs auto or dynamic among the --recompute plans");
}

// --baseline: "" or "torch", the latter only on a model bench_torch.py reproduces.
BenchBaseline baseline_flag(const Flags& f, const BenchOptions& o) {
  const std::string baseline = f.get("baseline");
  REMAT_CHECK(baseline.empty() || baseline == "torch", Error, "bench: --baseline expects 'torch', got '", baseline,
              "'");
  if (baseline.empty()) return BenchBaseline::none;
  const ModelConfig& c = o.model;
  REMAT_CHECK(c.experts == 0 && c.dropout == 0 && o.ep == 1 && o.dp == 1 && o.dtype != DType::f16 && !o.estimate, Error,
              "bench --baseline torch: the PyTorch baseline models the dense decoder without dropout in f32 "
              "or bf16 on one process; config ", c.name, " has ", c.experts, " experts and dropout ", c.dropout,
              ", --dtype ", dtype_name(o.dtype), ", --ep ", o.ep, o.estimate ? ", --estimate" : "");
  return BenchBaseline::torch;
}

// "1,2,2+sp,4": each item T or T+sp, checked against the config
// (check_tensor_parallel) before any run; Error naming the item otherwise.
std::vector<BenchOptions::TpLayout> tp_layouts(const std::string& text, const ModelConfig& c) {
  std::vector<BenchOptions::TpLayout> out;
  for (const std::string& item : comma_items(text, false)) {
    BenchOptions::TpLayout l;
    const std::string t = item.size() > 3 && item.compare(item.size() - 3, 3, "+sp") == 0 ? item.substr(0, item.size() - 3) : item;
    l.sp = t.size() != item.size();
    REMAT_CHECK(!t.empty() && t.find_first_not_of("0123456789") == std::string::npos && t.size() < 6 && std::stoll(t) >= 1,
                Error, "bench --tp: '", item, "' is not T or T+sp (T >= 1), e.g. --tp 1,2,2+sp");
    l.t = std::stoll(t);
    check_tensor_parallel(c, l.t, l.sp);
    out.push_back(l);
  }
  REMAT_CHECK(!out.empty(), Error, "bench --tp: give one or more layouts, e.g. --tp 1,2,2+sp");
  return out;
}

// --seq-range with what cannot take a length per batch: --estimate and
// --baseline torch (one fixed batch), a +sp layout (each length would have to
// divide by T), auto on several processes (their profile runs `plan`, which
// sees the config's length).
void check_seq_range(const Flags& f, const BenchOptions& o) {
  if (!o.seq_range) return;
  const std::string r = "bench --seq-range " + f.get("seq-range");
  REMAT_CHECK(!o.estimate && !o.torch(), Error, r, ": --estimate and --baseline torch measure one fixed batch; drop "
              "them or --seq-range");
  for (const BenchOptions::TpLayout& l : o.tp_layouts)
    REMAT_CHECK(!l.sp, Error, r, " with --tp ", f.get("tp"), ": sequence parallelism (+sp) splits every sequence over "
                "the T ranks, so each batch's length would have to divide by T; drop +sp or --seq-range");
  REMAT_CHECK(!o.has_auto || (o.ep == 1 && o.dp == 1), Error, r, ": --recompute auto on several processes (--dp, "
              "--ep) profiles through `plan`, which takes no range; name the plans, or bench one process");
}

}  // namespace

PipelineBenchSpec pipeline_bench_spec(const Flags& f, const std::string& config, const ModelConfig& c) {
  for (const char* other : {"ep", "dp", "zero", "tp", "baseline", "estimate", "pareto", "html", "memory-budget",
                            "offload-dir", "seq-range"})
    REMAT_CHECK(!f.has(other), Error, "bench --pp: --", other, " is not measured with a pipeline");
  REMAT_CHECK(f.get("device") == "cpu", Error, "bench --pp: pipelines run on the CPU under MPI for now");
  apply_threads_flag(f);
  PipelineBenchSpec spec;
  spec.config = config;
  spec.schedules = comma_items(f.get("pp-schedule"), false);
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
  return spec;
}

BenchOptions bench_options(const Flags& f, const std::string& config, const ModelConfig& loaded) {
  for (const char* pp_only : {"pp-schedule", "grad-accum", "micro-batch"})
    REMAT_CHECK(!f.has(pp_only), Error, "bench: --", pp_only, " needs --pp P (P >= 2)");
  BenchOptions o;
  o.config = config;
  o.model = loaded;
  if (f.has("seq-range")) {  // (the model is built for the longest: every check below sees MAX)
    o.seq_range = parse_seq_range(f.get("seq-range"));
    o.model.seq = o.seq_range->max;
  }
  const ModelConfig& c = o.model;
  plans_and_budgets(f, c, o);
  o.repeats = f.get_int("repeats");
  o.warmup = f.get_int("warmup");
  o.steps = f.get_int("steps");
  apply_threads_flag(f);
  o.threads = num_threads();
  o.ep = f.get_int("ep");
  o.dp = f.get_int("dp");
  o.zero = f.get_int("zero");
  o.tp_layouts = tp_layouts(f.get("tp"), c);
  o.seed = std::uint64_t(f.get_int("seed"));
  o.dtype = compute_dtype_from_name(f.get("dtype"));  // a bad --dtype fails before any run
  o.device = device_flag(f, true);
  o.estimate = f.get_bool("estimate");
  REMAT_CHECK(!o.device.is_meta() || o.estimate, DeviceError, "bench: --device meta has no clock to time steps; it "
              "runs with --estimate (each plan's activation bytes and estimated step time on shapes alone), or use "
              "`mem --device meta` / `plan --device meta` (docs/META.md)");
  o.device_model = f.get("device-model");
  check_device_model(o.device_model);
  REMAT_CHECK(o.device.is_cpu() || o.device.is_meta() || o.device.index < cuda_device_count(), DeviceError, "bench: --device ",
              o.device.str(), ": ", cuda_device_count(), " CUDA devices present",
              cuda_built() ? "" : " (this build has no CUDA back end)");
  REMAT_CHECK(o.device.is_cpu() || o.ep == 1, Error, "bench: --ep with --device cuda needs the NCCL back end in the "
              "trainer, which is not wired yet; use --ep on the CPU");
  REMAT_CHECK(o.ep == 1 || (c.experts % o.ep == 0 && c.batch % o.ep == 0), Error, "bench: --ep ", o.ep,
              " needs the ", c.experts, " experts and the batch of ", c.batch, " to divide by it");
  REMAT_CHECK(o.dp == 1 || (o.dp % o.ep == 0 && c.batch % o.dp == 0), Error, "bench: --dp ", o.dp, " needs --ep ",
              o.ep, " and the batch of ", c.batch, " to divide it");
  REMAT_CHECK(o.zero == 0 || o.dp >= 2, Error, "bench: --zero ", o.zero,
              " shards over data-parallel ranks; give --dp D (D >= 2)");
  REMAT_CHECK(o.device.is_cpu() || o.dp == 1, Error, "bench: --dp with --device cuda needs the NCCL back end in "
              "the trainer, which is not wired yet; use --dp on the CPU");
  REMAT_CHECK(!o.estimate || (o.dp == 1 && o.ep == 1), Error, "bench --estimate: one process (give the ranks to "
              "`mem --device meta --simulate-world`)");
  REMAT_CHECK(!o.estimate || ((o.device.is_cpu() || o.device.is_meta()) && o.dtype == DType::f32), Error,
              "bench: --estimate traces f32 steps on the CPU or meta; drop --dtype, and --device cuda, for it");
  const bool tensor_parallel = o.tp_layouts.size() > 1 || o.tp_layouts[0].t > 1;
  REMAT_CHECK(!tensor_parallel || (o.device.is_cpu() && o.zero == 0 && !o.estimate), Error, "bench --tp ",
              f.get("tp"), ": tensor parallelism runs on the CPU under MPI, without --zero or --estimate, for now");
  REMAT_CHECK(!tensor_parallel || !o.has_auto, Error, "bench --tp ", f.get("tp"),
              ": --recompute auto does not profile under tensor parallelism yet; name the plans");
  o.baseline = baseline_flag(f, o);
  check_seq_range(f, o);
  if (f.has("peak-flops")) o.peak_flops = f.get_double("peak-flops");
  if (f.has("json")) o.json_path = f.get("json");
  if (f.has("html")) o.html_path = f.get("html");
  o.offload_dir = f.has("offload-dir") ? f.get("offload-dir") : "";
  return o;
}

}  // namespace remat::tools
