#include "tools/bench_pipeline.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <thread>

#include "engine/error.h"
#include "engine/parallel_for.h"
#include "tools/args.h"
#include "tools/bench_order.h"
#include "tools/bench_worker.h"
#include "tools/html.h"
#include "tools/json.h"
#include "train/trainer.h"

namespace remat::tools {

namespace {

// The figures each stage reports per step (PipelineStageStats), by key.
const char* const kStageKeys[] = {"first_block", "end_block",   "peak_allocated_bytes", "activation_bytes",
                                  "in_flight",   "forward_ms",  "backward_ms",          "idle_ms",
                                  "bubble",      "sent_bytes"};
std::vector<double> stage_values(const PipelineStageStats& p) {
  return {double(p.first_block), double(p.end_block), double(p.peak_allocated_bytes), double(p.activation_bytes),
          double(p.in_flight),   p.forward_ms,          p.backward_ms,                  p.idle_ms,
          p.bubble(),            double(p.sent_bytes)};
}
std::string stage_key(std::int64_t stage, const char* key) { return "s" + std::to_string(stage) + "_" + key; }

struct Variant {
  std::string schedule, plan;
  std::string name() const { return schedule + (plan == "none" ? "" : "+" + plan); }
};

std::map<std::string, double> run_pipeline_worker(const PipelineBenchSpec& s, const Variant& v, std::int64_t batch) {
  // Processes beyond the cores wait for their neighbours in MPI: yielding
  // there leaves the cores to the stages that compute.
  const bool oversubscribed = s.pp > std::int64_t(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = std::max<int>(1, s.threads / int(s.pp));
  const std::string cmd =
      "mpirun --oversubscribe " + std::string(::geteuid() == 0 ? "--allow-run-as-root " : "") +
      (oversubscribed ? "--mca mpi_yield_when_idle 1 " : "") + "-np " + std::to_string(s.pp) + " '/proc/" +
      std::to_string(::getpid()) + "/exe' bench-pipeline-worker --config '" + s.config + "' --recompute '" + v.plan +
      "' --pp-schedule " + v.schedule + " --pp " + std::to_string(s.pp) + " --grad-accum " +
      std::to_string(s.micro_batches) + " --batch " + std::to_string(batch) + " --warmup " +
      std::to_string(s.warmup) + " --steps " + std::to_string(s.steps) + " --threads " + std::to_string(threads) +
      " --seed " + s.seed + " --dtype " + s.dtype + " 2>&1";
  return run_bench_result(cmd, "bench --pp: the job for " + v.name());
}

}  // namespace

int run_bench_pipeline_worker(const std::vector<std::string>& args) {
  Flags f("bench-pipeline-worker", "(internal) one pipeline job of bench --pp: prints BENCH-RESULT {json} on rank 0",
          args,
          {text_flag("config", "model config name or FILE.json", "bench-dense"),
           text_flag("recompute", "one recompute plan", "none"),
           int_flag("pp", "pipeline stages (the job's size)", 2, {.min = 2}),
           text_flag("pp-schedule", "gpipe or 1f1b", "1f1b"),
           int_flag("grad-accum", "micro-batches per step", 4, {.min = 1}),
           int_flag("batch", "sequences per step (0: the config's)", 0, {.min = 0}),
           int_flag("warmup", "untimed warm-up steps", 1, {.min = 0}),
           int_flag("steps", "timed steps", 3, {.min = 1}),
           threads_flag_spec(),
           int_flag("seed", "seed", 0, {.min = 0}),
           text_flag("dtype", "compute dtype: f32 or bf16", "f32")});
  apply_threads_flag(f);
  TrainOptions o;
  o.config = ModelConfig::load(f.get("config"));
  if (f.get_int("batch") > 0) o.config.batch = f.get_int("batch");
  o.recompute = f.get("recompute");
  o.pp = f.get_int("pp");
  o.pp_schedule = parse_pipeline_schedule(f.get("pp-schedule"));
  o.grad_accum = f.get_int("grad-accum");
  const std::int64_t warmup = f.get_int("warmup"), steps = f.get_int("steps");
  o.steps = warmup + steps;
  o.warmup = 0;
  o.schedule = LrSchedule::constant;
  o.lr = o.min_lr = 1e-3;
  o.eval_every = 0;
  o.eval_batches = 1;
  o.seed = std::uint64_t(f.get_int("seed"));
  o.dtype = compute_dtype_from_name(f.get("dtype"));
  Trainer trainer(o);
  std::map<std::string, std::vector<double>> series;
  std::int64_t stages = 0;
  trainer.run([&](const StepStats& st) {
    if (st.step <= warmup) return;
    series["step_ms"].push_back(st.step_ms);
    stages = std::int64_t(st.pipeline_stages.size());
    for (const PipelineStageStats& p : st.pipeline_stages) {
      const std::vector<double> v = stage_values(p);
      for (std::size_t k = 0; k < v.size(); ++k) series[stage_key(p.stage, kStageKeys[k])].push_back(v[k]);
    }
  });
  if (trainer.rank() != 0) return 0;
  JsonObject j;
  j.set("stages", stages).set("tokens", double(o.config.batch * o.config.seq));
  for (const auto& [k, v] : series) j.set(k, median(v));
  std::printf("BENCH-RESULT %s\n", j.str().c_str());
  return 0;
}

namespace {

// Each variant's result fields over its repeats, and one --json object per job.
struct PipelineRuns {
  std::vector<std::map<std::string, std::vector<double>>> got;
  std::vector<JsonObject> runs;
};

// Runs the jobs in `order`, a line per job.
PipelineRuns run_jobs(const PipelineBenchSpec& s, const std::vector<Variant>& variants,
                      const std::vector<BenchSlot>& order, std::int64_t batch) {
  PipelineRuns r;
  r.got.resize(variants.size());
  for (const BenchSlot& slot : order) {
    const Variant& v = variants[std::size_t(slot.variant)];
    const auto res = run_pipeline_worker(s, v, batch);
    for (const auto& [k, val] : res) r.got[std::size_t(slot.variant)][k].push_back(val);
    JsonObject run;
    run.set("variant", v.name()).set("repeat", slot.repeat).set("position", slot.position).set("slot", slot.slot);
    run.set("step_ms", res.at("step_ms"));
    r.runs.push_back(run);
    std::printf("  [%2lld/%zu] %-22s repeat %lld: step %.0f ms\n", static_cast<long long>(slot.position + 1),
                order.size(), v.name().c_str(), static_cast<long long>(slot.repeat + 1), res.at("step_ms"));
    std::fflush(stdout);
  }
  return r;
}

// The per-stage table: a line per stage of each variant, next to the
// bubble's arithmetic `theory`; each variant's --json row.
std::vector<JsonObject> stage_table(const PipelineBenchSpec& s, const ModelConfig& c,
                                    const std::vector<Variant>& variants, const PipelineRuns& r, double theory) {
  const std::int64_t P = s.pp, M = s.micro_batches;
  std::vector<JsonObject> rows;
  std::printf("\n%-20s %8s %5s %7s %9s %9s %9s %8s %8s %8s %7s %8s %9s\n", "variant", "step ms", "stage", "blocks",
              "peak MiB", "activ.", "in-flight", "fwd ms", "bwd ms", "idle ms", "bubble", "(P-1)/", "sent MiB");
  std::printf("%-20s %8s %5s %7s %9s %9s %9s %8s %8s %8s %7s %8s %9s\n", "", "", "", "", "", "MiB", "", "", "", "", "",
              "(M+P-1)", "");
  for (std::size_t i = 0; i < variants.size(); ++i) {
    auto med = [&](const std::string& k) { return median(r.got[i].at(k)); };
    const auto& sv = r.got[i].at("step_ms");
    const double step = med("step_ms");
    JsonObject row;
    row.set("variant", variants[i].name()).set("schedule", variants[i].schedule).set("plan", variants[i].plan);
    row.set("config", c.name).set("pp", P).set("grad_accum", M).set("micro_batch_rows", s.micro_rows);
    row.set("repeats", s.repeats).set("step_ms", step);
    row.set("step_ms_min", min_of(sv));
    row.set("step_ms_max", max_of(sv));
    row.set("tokens_per_s", med("tokens") / (step * 1e-3)).set("bubble_theory", theory);
    std::vector<JsonObject> stage_rows;
    for (std::int64_t st = 0; st < P; ++st) {
      auto sm = [&](const char* k) { return med(stage_key(st, k)); };
      std::printf("%-20s %8s %5lld %7s %9.1f %9.1f %9.0f %8.0f %8.0f %8.0f %6.1f%% %7.1f%% %9.2f\n",
                  st == 0 ? variants[i].name().c_str() : "", st == 0 ? fmt("%.0f", step).c_str() : "",
                  static_cast<long long>(st), fmt("%.0f-%.0f", sm("first_block"), sm("end_block") - 1).c_str(),
                  sm("peak_allocated_bytes") / 1048576.0, sm("activation_bytes") / 1048576.0, sm("in_flight"),
                  sm("forward_ms"), sm("backward_ms"), sm("idle_ms"), 100 * sm("bubble"), 100 * theory,
                  sm("sent_bytes") / 1048576.0);
      JsonObject sj;
      sj.set("stage", st);
      for (const char* k : kStageKeys) sj.set(k, sm(k));
      stage_rows.push_back(sj);
    }
    std::string stages_json = json_array(stage_rows);
    row.set_raw("stages", stages_json);
    rows.push_back(row);
  }
  std::printf("(medians over repeats of each job's median step; in-flight: micro-batches a stage held activations "
              "for at once; idle: waiting for a neighbour; bubble: idle / (forward + backward + idle), next to "
              "(P - 1) / (M + P - 1) for equal stages and free messages)\n");
  return rows;
}

void write_pipeline_json(const PipelineBenchSpec& s, const ModelConfig& c, const std::vector<JsonObject>& rows,
                         const std::vector<JsonObject>& runs) {
  const std::int64_t P = s.pp;
  JsonObject doc;
  doc.set("config", c.name).set("pp", P).set("grad_accum", s.micro_batches).set("micro_batch_rows", s.micro_rows);
  doc.set("threads_per_stage", std::max<int>(1, s.threads / int(P))).set("repeats", s.repeats);
  doc.set("warmup", s.warmup).set("steps", s.steps).set("order", "williams").set("dtype", s.dtype);
  doc.set_raw("rows", json_array(rows));
  doc.set_raw("runs", json_array(runs));
  std::ofstream out(s.json_path);
  REMAT_CHECK(out.good(), IOError, "bench: cannot write ", s.json_path);
  out << doc.str() << "\n";
  std::printf("wrote %s\n", s.json_path.c_str());
}

}  // namespace

int run_pipeline_bench(const PipelineBenchSpec& s) {
  const ModelConfig c = ModelConfig::load(s.config);
  REMAT_CHECK(s.pp >= 2 && s.pp <= c.n_layers, Error, "bench --pp ", s.pp, ": config ", c.name, " has ", c.n_layers,
              " blocks; every stage needs at least one");
  for (const std::string& sc : s.schedules) parse_pipeline_schedule(sc);  // bad names before any run
  const std::int64_t P = s.pp, M = s.micro_batches, batch = s.micro_rows * M;
  std::vector<Variant> variants;
  for (const std::string& sc : s.schedules)
    for (const std::string& plan : s.plans) variants.push_back({sc, plan});
  const auto order = bench_order(std::int64_t(variants.size()), s.repeats);
  const double theory = double(P - 1) / double(M + P - 1);
  std::printf("remat bench: config %s, %lld pipeline stages x %lld micro-batches of %lld sequence(s), %d thread(s) "
              "per stage, %lld repeats x (%lld warm-up + %lld timed steps); %zu jobs in a balanced interleaved order\n",
              c.name.c_str(), static_cast<long long>(P), static_cast<long long>(M),
              static_cast<long long>(s.micro_rows), std::max<int>(1, s.threads / int(P)),
              static_cast<long long>(s.repeats), static_cast<long long>(s.warmup), static_cast<long long>(s.steps),
              order.size());
  std::fflush(stdout);
  const PipelineRuns r = run_jobs(s, variants, order, batch);
  const std::vector<JsonObject> rows = stage_table(s, c, variants, r, theory);
  if (!s.json_path.empty()) write_pipeline_json(s, c, rows, r.runs);
  return 0;
}

}  // namespace remat::tools
