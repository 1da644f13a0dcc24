// ./remat bench: each plan x repeat runs in a fresh process (this binary
// re-executed as `bench-worker`, tools/bench_worker.cc), so allocator caches,
// peaks and warm state never leak from one measurement into the next. The
// parent resolves the planner's rows, runs the processes in a balanced
// interleaved order and reports medians and min-max over repeats, ratios
// against `none`, MFU and HFU (tools/bench_report.h).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>

#include "engine/error.h"
#include "tools/args.h"
#include "tools/auto_plan_flags.h"
#include "tools/bench_estimate.h"
#include "tools/bench_flops.h"
#include "tools/bench_options.h"
#include "tools/bench_order.h"
#include "tools/bench_pipeline.h"
#include "tools/bench_report.h"
#include "tools/bench_torch.h"
#include "tools/bench_worker.h"
#include "tools/commands.h"
#include "tools/json.h"

namespace remat::tools {

namespace {

// The rows to measure: the plans as named in the tables, what each one's
// workers run (an auto row: the plan chosen for its budget) and the planner's
// choices.
struct BenchRows {
  std::vector<std::string> names, run_plans;
  std::map<std::size_t, AutoRow> autos;
  std::vector<BenchOptions::TpLayout> layouts;  // per row (--tp); empty: one process layout for all
};

// The plans as given: every row runs its own name; under several --tp
// layouts every plan under each ("per_block @tp2+sp"; T = 1 keeps the name).
BenchRows hand_rows(const BenchOptions& o) {
  if (o.tp_layouts.size() == 1 && o.tp_layouts[0].t == 1) return {o.plans, o.plans, {}, {}};
  BenchRows rows;
  for (const BenchOptions::TpLayout& l : o.tp_layouts)
    for (const std::string& p : o.plans) {
      rows.names.push_back(l.t == 1 ? p : p + " @tp" + std::to_string(l.t) + (l.sp ? "+sp" : ""));
      rows.run_plans.push_back(p);
      rows.layouts.push_back(l);
    }
  return rows;
}

// With auto among the plans: one profile (in this process, before any
// worker), then one row per budget ("auto" for one budget, "auto B" for
// several), each running the plan chosen and checked for it. A budget no plan
// reaches is reported and skipped (a finding, not a failure: the other plans
// still run and compare); only when no row is left does the bench stop.
// The planner's choices for a worker of several processes (--dp, --ep):
// the profile must run as the worker runs (its ranks, --zero), so `plan`
// runs under mpirun for every budget at once; its --json gives the choices,
// keyed by budget text (a budget no plan reaches is absent).
std::map<std::string, AutoPlan> job_choices(const Flags& f, const BenchOptions& o) {
  const WorkerRanks ranks{o.ep, o.dp, o.zero};
  std::string budgets;
  for (const auto& b : o.budgets) budgets += (budgets.empty() ? "" : ",") + b;
  const std::string json =
      (std::filesystem::temp_directory_path() / ("remat-bench-plan-" + std::to_string(::getpid()) + ".json")).string();
  const std::string cmd =
      "mpirun --oversubscribe " + std::string(::geteuid() == 0 ? "--allow-run-as-root " : "") + "-np " +
      std::to_string(ranks.processes()) + " '/proc/" + std::to_string(::getpid()) + "/exe' plan --config '" +
      o.config + "' --dtype " + dtype_name(o.dtype) + " --device " + o.device.str() + " --seed " +
      std::to_string(o.seed) + " --memory-budget '" + budgets + "' --zero " + std::to_string(o.zero) + " --ep " +
      std::to_string(o.ep) + " --profile-rounds " + std::to_string(f.get_int("profile-rounds")) + " --threads " +
      std::to_string(std::max<std::int64_t>(1, o.threads / ranks.processes())) +
      (f.get_bool("allow-lossy") ? " --allow-lossy" : "") +
      (o.offload_dir.empty() ? "" : " --offload-dir '" + o.offload_dir + "'") + " --json '" + json + "' 2>&1";
  int rc = 0;
  const std::string out = run_capture(cmd, "bench: the planner's profile under mpirun", &rc);
  std::ifstream in(json);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(json.c_str());
  REMAT_CHECK(rc == 0 && !text.empty(), Error, "bench: the planner's profile under mpirun (", cmd, ") failed:\n", out);
  const Json doc = Json::parse(text, "bench: the planner's --json");
  std::vector<Json> per;
  if (doc.has("budgets")) per = doc.at("budgets").items();
  else per.push_back(doc);
  std::map<std::string, AutoPlan> out_plans;
  for (const Json& b : per) {
    if (b.has("skipped")) {
      std::printf("  auto %-6s skipped: %s\n", b.at("memory_budget").as_string().c_str(),
                  b.at("skipped").as_string().c_str());
      continue;
    }
    AutoPlan a;
    a.budget = b.at("budget_bytes").as_int();
    a.best.feasible = true;
    a.best.plan = b.at("chosen_plan").as_string();
    a.best.peak = b.at("predicted_peak_bytes").as_int();
    a.predicted_step_ms = b.at("predicted_step_ms").as_number();
    out_plans[b.at("memory_budget").as_string()] = a;
    std::printf("  budget %-6s = %s: %s (predicted peak %s, a checking run on the ranks %s; step %.0f ms)\n",
                b.at("memory_budget").as_string().c_str(), format_mib(a.budget).c_str(), a.best.plan.c_str(),
                format_mib(a.best.peak).c_str(), format_mib(b.at("checked_peak_bytes").as_int()).c_str(),
                a.predicted_step_ms);
  }
  return out_plans;
}

// The rows: the hand plans as given, and per budget an auto row running
// the plan `choose` returns for it (nullopt: none fits, skipped).
BenchRows rows_with_choices(const BenchOptions& o,
                            const std::function<std::optional<AutoPlan>(const std::string&)>& choose) {
  BenchRows rows;
  for (const auto& p : o.plans) {
    if (p != "auto") {
      rows.names.push_back(p);
      rows.run_plans.push_back(p);
      continue;
    }
    for (const auto& b : o.budgets) {
      const std::optional<AutoPlan> a = choose(b);
      if (!a) continue;
      rows.autos[rows.names.size()] = {b, *a};
      rows.names.push_back(o.budgets.size() == 1 ? "auto" : "auto " + b);
      rows.run_plans.push_back(a->best.plan);
    }
  }
  return rows;
}

BenchRows auto_rows(const Flags& f, const BenchOptions& o) {
  const ModelConfig& c = o.model;
  if (const std::int64_t np = WorkerRanks{o.ep, o.dp, o.zero}.processes(); np > 1) {
    std::printf("remat bench: profiling %s for --recompute auto on %lld ranks (--zero %lld)\n", c.name.c_str(),
                static_cast<long long>(np), static_cast<long long>(o.zero));
    std::fflush(stdout);
    const std::map<std::string, AutoPlan> chosen = job_choices(f, o);
    BenchRows rows = rows_with_choices(o, [&](const std::string& b) -> std::optional<AutoPlan> {
      const auto it = chosen.find(b);
      if (it == chosen.end()) return std::nullopt;  // (job_choices printed why)
      return it->second;
    });
    REMAT_CHECK(!rows.names.empty(), Error, "bench: no plan fits any --memory-budget on the ranks (the planner's "
                "output above says the smallest peak), and no other plan is listed");
    return rows;
  }
  std::printf("remat bench: profiling %s for --recompute auto (%lld rounds of each plan component)\n", c.name.c_str(),
              static_cast<long long>(f.get_int("profile-rounds")));
  std::fflush(stdout);
  const ProfileOptions popts = profile_options_for_flags(f, c, dtype_name(o.dtype), o.device, o.seed, false);
  const PlanProfile prof = profile_plans(popts);
  std::exception_ptr first_skip;
  BenchRows rows = rows_with_choices(o, [&](const std::string& b) -> std::optional<AutoPlan> {
    std::optional<CheckedPlan> checked;
    try {
      checked = checked_choice(f, prof, popts, b);
    } catch (const Error& e) {
      std::printf("  auto %-6s skipped: %s\n", b.c_str(), e.what());
      if (!first_skip) first_skip = std::current_exception();
      return std::nullopt;
    }
    const AutoPlan& a = checked->plan;
    std::printf("  budget %-6s = %s: %s (predicted peak %s, a checking run %s; step %.0f ms)\n", b.c_str(),
                format_mib(a.budget).c_str(), a.best.plan.c_str(), format_mib(a.best.peak).c_str(),
                format_mib(checked->measured_peak).c_str(), a.predicted_step_ms);
    return a;
  });
  std::printf("  (profile: %zu components in %.0f s)\n", prof.candidates.size(), prof.seconds);
  if (rows.names.empty() && first_skip) std::rethrow_exception(first_skip);  // (nothing else to run: the planner's own error)
  return rows;
}

// Plans with `dynamic` and no budget: one row per --memory-budget ("P" for
// one budget, "P B" for several), each running P with dynamic:BYTES. N% is
// of plan none's activations above the persistent bytes, from one profile
// of none (in this process, before any worker; one process only).
void expand_dynamic_rows(const Flags& f, const BenchOptions& o, BenchRows& rows) {
  std::optional<PlanProfile> none;
  auto bytes_of = [&](const std::string& b) {
    if (b.empty() || b.back() != '%') return parse_memory_budget(b, PlanProfile{});
    if (!none) {
      const WorkerRanks ranks{o.ep, o.dp, o.zero};
      REMAT_CHECK(ranks.processes() == 1, Error, "bench: --recompute dynamic with --memory-budget ", b,
                  " on several processes: give the budget in bytes (e.g. 1.5GiB)");
      ProfileOptions popts = profile_options_for_flags(f, o.model, dtype_name(o.dtype), o.device, o.seed, false);
      popts.candidates = {"none"};
      popts.rounds = 1;
      none = profile_plans(popts);
    }
    return parse_memory_budget(b, *none);
  };
  BenchRows out;
  for (std::size_t i = 0; i < rows.names.size(); ++i) {
    RecomputePlan p = RecomputePlan::parse(rows.run_plans[i], o.model.n_layers);
    const bool expand = p.dynamic && p.dynamic_budget == 0;
    for (std::size_t k = 0; k < (expand ? o.budgets.size() : 1); ++k) {
      if (auto a = rows.autos.find(i); a != rows.autos.end()) out.autos[out.names.size()] = a->second;
      if (!rows.layouts.empty()) out.layouts.push_back(rows.layouts[i]);
      if (!expand) {
        out.names.push_back(rows.names[i]);
        out.run_plans.push_back(rows.run_plans[i]);
        continue;
      }
      p.dynamic_budget = bytes_of(o.budgets[k]);
      out.names.push_back(o.budgets.size() == 1 ? rows.names[i] : rows.names[i] + " " + o.budgets[k]);
      out.run_plans.push_back(p.str());
      std::printf("  %s: budget %s = %s\n", out.names.back().c_str(), o.budgets[k].c_str(),
                  format_mib(p.dynamic_budget).c_str());
    }
  }
  rows = std::move(out);
}

// Runs every variant (the rows, then the PyTorch baseline if any) `repeats`
// times in a balanced interleaved order, one fresh process each, printing a
// line per process.
void run_variants(const BenchOptions& o, const BenchRows& rows, TorchBaseline* torch, BenchMeasurements& m) {
  const std::int64_t V = std::int64_t(m.variants.size());
  const auto order = bench_order(V, o.repeats);
  std::printf("remat bench: config %s on %s, %d threads, %lld repeats x (%lld warm-up + %lld timed steps), peak %.1f "
              "GFLOP/s%s; %zu processes in a balanced interleaved order%s\n",
              o.model.name.c_str(), o.device.str().c_str(), o.threads, static_cast<long long>(o.repeats),
              static_cast<long long>(o.warmup), static_cast<long long>(o.steps), m.peak_flops / 1e9,
              o.peak_flops ? "" : o.device.is_cuda() ? " (device dense peak)" : " (measured GEMM)", order.size(),
              o.seq_range ? ("; sequence lengths drawn from " + o.seq_range_text() + ", the same in every process")
                                .c_str()
                          : "");
  std::fflush(stdout);
  m.samples.assign(std::size_t(V), {});
  for (const BenchSlot& s : order) {
    const std::string& name = m.variants[std::size_t(s.variant)];
    const bool is_torch = torch && s.variant == V - 1;
    const BenchOptions::TpLayout layout = rows.layouts.empty() || is_torch ? o.tp_layouts[0] : rows.layouts[std::size_t(s.variant)];
    const auto r = is_torch ? torch->run(o.threads, dtype_name(o.dtype), o.device.str(), o.warmup, o.steps)
                            : run_worker(o.config, rows.run_plans[std::size_t(s.variant)], o.warmup, o.steps,
                                         o.threads, std::to_string(o.seed), WorkerRanks{o.ep, o.dp, o.zero, layout.t, layout.sp},
                                         dtype_name(o.dtype), o.device.str(), o.offload_dir, o.seq_range_text());
    for (const auto& [k, val] : r) m.samples[std::size_t(s.variant)][k].push_back(val);
    JsonObject run;
    run.set("variant", name).set("repeat", s.repeat).set("position", s.position).set("slot", s.slot);
    for (const char* k : {"step_ms", "step_ms_best", "forward_ms", "backward_ms", "peak_allocated_bytes",
                          "peak_reserved_bytes", "activation_bytes"})
      if (r.count(k) && !(is_torch && o.device.is_cpu() && std::string(k).find("bytes") != std::string::npos))
        run.set(k, r.at(k));  // (PyTorch reports no CPU memory peaks)
    m.runs.push_back(run);
    std::printf("  [%2lld/%zu] %-24s repeat %lld: step %.0f ms (forward %.0f, backward %.0f)\n",
                static_cast<long long>(s.position + 1), order.size(), name.c_str(),
                static_cast<long long>(s.repeat + 1), r.at("step_ms"), r.at("forward_ms"), r.at("backward_ms"));
    std::fflush(stdout);
  }
  if (torch) m.framework = torch->framework();
}

// The peak MFU is measured against: --peak-flops, the CUDA device's dense
// peak, or the CPU's measured GEMM peak.
double initial_peak_flops(const BenchOptions& o) {
  return o.peak_flops         ? *o.peak_flops
         : o.device.is_cuda() ? cuda_peak_flops(o.device, o.dtype)
                              : measure_peak_flops();
}

// A measured (CPU) peak, measured again after the runs and taken with every
// worker's probe: the highest figure is the peak.
void remeasure_peak_flops(BenchMeasurements& m) {
  double after = measure_peak_flops();
  for (const auto& var : m.samples)
    if (var.count("gemm_peak_flops"))
      for (double p : var.at("gemm_peak_flops")) after = std::max(after, p);
  if (after > m.peak_flops)
    std::printf("(GEMM peak measured again after the runs and in every worker: %.1f GFLOP/s, used for MFU)\n",
                after / 1e9);
  m.peak_flops = std::max(m.peak_flops, after);
}

}  // namespace

int run_bench(const std::vector<std::string>& args) {
  Flags f("bench", "memory and speed of recompute plans, each repeat in a fresh process, in a balanced interleaved "
          "order", args, bench_flag_specs());
  const std::string config = f.get("config");
  const ModelConfig c = ModelConfig::load(config);
  if (f.get_int("pp") > 1) return run_pipeline_bench(pipeline_bench_spec(f, config, c));
  const BenchOptions o = bench_options(f, config, c);
  if (o.estimate) return run_estimate(o);
  std::optional<TorchBaseline> torch;
  if (o.torch()) torch.emplace(c);
  BenchMeasurements m;
  m.peak_flops = initial_peak_flops(o);
  BenchRows rows = o.has_auto ? auto_rows(f, o) : hand_rows(o);
  if (o.has_dynamic) expand_dynamic_rows(f, o, rows);
  m.plans = rows.names;
  m.autos = rows.autos;
  m.variants = m.plans;
  if (torch) m.variants.push_back("torch");
  run_variants(o, rows, torch ? &*torch : nullptr, m);
  if (!o.peak_flops && !o.device.is_cuda()) remeasure_peak_flops(m);
  report_bench(o, m);
  return 0;
}

}  // namespace remat::tools
