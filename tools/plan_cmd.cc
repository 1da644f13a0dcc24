// ./remat plan: the memory-budget planner on its own. Profiles the config
// once (train/auto_plan.h) and, for each --memory-budget of a comma list,
// prints the plan chosen with its predicted peak and step time, the best
// alternatives and the smallest achievable peak; --measure runs every plan
// listed in fresh bench processes (interleaved, each plan once whichever
// budgets list it) and prints predicted next to measured per budget.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "engine/error.h"
#include "engine/parallel_for.h"
#include "models/decoder.h"
#include "parallel/process_group.h"
#include "tools/args.h"
#include "tools/auto_plan_flags.h"
#include "tools/bench_order.h"
#include "tools/bench_worker.h"
#include "tools/commands.h"
#include "tools/html.h"
#include "tools/json.h"

namespace remat::tools {

namespace {

// The command's flags, checked once.
struct PlanOptions {
  std::vector<std::string> budget_texts;  // --memory-budget's items
  std::string config;                     // as given (the bench workers load it again)
  ModelConfig model;
  DType dtype = DType::f32;
  Device device;
  std::uint64_t seed = 0;
  bool lossy = false;
  std::int64_t ranks = 1, ep = 1, zero = 0;  // the job profiled (ranks 1: one process)
  bool several() const { return budget_texts.size() > 1; }
};

std::vector<FlagSpec> plan_flag_specs() {
  std::vector<FlagSpec> specs = {
      text_flag("config", "model config name or FILE.json", "bench-dense"),
      text_flag("dtype", "compute dtype: f32 or bf16", "f32"),
      text_flag("device", "cpu, cuda, cuda:N or meta (shapes only: exact bytes, estimated times; docs/META.md)", "cpu"),
      meta_kernels_flag_spec(),
      int_flag("seed", "seed", 0, {.min = 0}),
      text_flag("offload-dir", "directory for the offload plans' spill file (default: $TMPDIR or /tmp)"),
      text_flag("json", "write the profile, the choice and (with --measure) the measurements to FILE"),
      bool_flag("measure", "also run the chosen plan and the alternatives in fresh processes (bench workers, in an "
                "interleaved order) and print predicted next to measured"),
      int_flag("repeats", "with --measure: processes per plan", 2, {.min = 1}),
      int_flag("warmup", "with --measure: untimed warm-up steps per process", 1, {.min = 0}),
      int_flag("steps", "with --measure: timed steps per process", 3, {.min = 1}),
      int_flag("tp", "under mpirun: the tensor-parallel degree the ranks profile under, as train --tp", 1, {.min = 1}),
      bool_flag("sp", "with --tp: sequence parallel, as train --sp"),
      int_flag("zero", "under mpirun: the ZeRO stage the ranks profile under, as train --zero (0: none)", 0,
               {.min = 0, .max = 3}),
      int_flag("ep", "under mpirun: the expert-parallel degree the ranks profile under, as train --ep", 1,
               {.min = 1}),
      threads_flag_spec()};
  for (auto& s : auto_plan_flag_specs()) specs.push_back(s);
  for (auto& s : simulate_flag_specs()) specs.push_back(s);
  return specs;
}

PlanOptions plan_options(const Flags& f) {
  REMAT_CHECK(f.has("memory-budget"), Error, "plan: --memory-budget B is required (bytes with a unit, e.g. 1.5GiB, "
              "or N% of plan none's activation bytes; several as a comma list)");
  PlanOptions o;
  {
    std::stringstream in(f.get("memory-budget"));
    for (std::string b; std::getline(in, b, ',');) o.budget_texts.push_back(b);
  }
  for (const auto& b : o.budget_texts)
    REMAT_CHECK(!b.empty(), Error, "plan: --memory-budget '", f.get("memory-budget"), "' has an empty item");
  o.config = f.get("config");
  o.model = ModelConfig::load(o.config);
  o.dtype = compute_dtype_from_name(f.get("dtype"));
  o.device = device_flag(f, true);
  if (const auto r = simulated_rank_flags(f, o.device)) scale_simulated_batch(o.model, *r, 1);
  o.seed = std::uint64_t(f.get_int("seed"));
  o.lossy = f.get_bool("allow-lossy");
  o.ranks = world_group()->size();
  o.ep = f.get_int("ep");
  o.zero = f.get_int("zero");
  return o;
}

// One line of a budget's table: the chosen plan, an alternative or the
// smallest-peak plan, with the profile's predictions.
struct Row {
  std::string role, plan;
  std::int64_t peak;
  double step_ms;
  std::size_t measured = 0;  // index into the measured plans
};

// Per budget: the choice (an Error below the smallest peak, naming it; with
// several budgets that budget is reported and skipped), checked by a run.
struct Choice {
  std::string text;
  std::int64_t budget = 0;
  std::optional<CheckedPlan> checked;
  std::string skipped;  // why no plan fits
  std::vector<Row> rows;
};

// The medians over one measured plan's processes.
struct Measured {
  double peak = 0, step_ms = 0, step_ms_best = 0;
};

// --zero 3: what keeping each block's gathered parameters changes.
void print_keep_gathered(const PlanProfile& prof) {
  const KeepGatheredProfile& k = prof.keep_gathered;
  if (!k.measured) return;
  std::printf("keep_gathered (--zero 3), per block: held +MiB / step ms");
  for (const PlanChoice& d : k.delta) std::printf("  %+.1f/%+.1f", double(d.held) / 1048576.0, d.time_ms);
  std::printf("\n");
}

void print_profile(const PlanProfile& prof) {
  std::printf("profile: %zu components in %.0f s; persistent %s", prof.candidates.size() + prof.chunked_loss.measured,
              prof.seconds, format_mib(prof.persistent).c_str());
  if (prof.sharding_working > 0) std::printf(", ZeRO working set %s", format_mib(prof.sharding_working).c_str());
  std::printf(", plan none: peak %s (activations %s), step %.0f ms\n", format_mib(prof.none_peak).c_str(),
              format_mib(prof.none_activation_bytes()).c_str(), prof.none_step_ms);
  // The loss region (the head's logits and the loss's) apart from the blocks.
  std::printf("loss region: %s at most in plan none's step", format_mib(prof.none_loss_peak).c_str());
  if (prof.chunked_loss.measured)
    std::printf("; chunked_loss: %s at most, forward-end base %s (none's %s), step +%.0f ms",
                format_mib(prof.chunked_loss.loss_peak).c_str(), format_mib(prof.chunked_loss.forward_base).c_str(),
                format_mib(prof.forward_base).c_str(), prof.chunked_loss.extra_ms);
  std::printf("\n");
  print_keep_gathered(prof);
}

// The plan chosen for budget `text` and its table (chosen, alternatives,
// smallest peak), and how the checking run went.
Choice choose_for_budget(const Flags& f, const PlanOptions& o, const PlanProfile& prof, const ProfileOptions& popts,
                         const std::string& text) {
  Choice ch;
  ch.text = text;
  ch.budget = parse_memory_budget(text, prof);
  std::printf("\nbudget %s = %s peak allocated\n", text.c_str(), format_mib(ch.budget).c_str());
  try {
    ch.checked = checked_choice(f, prof, popts, text);
  } catch (const Error& e) {
    if (!o.several()) throw;
    ch.skipped = e.what();
    std::printf("  no plan fits: %s\n", e.what());
    return ch;
  }
  const CheckedPlan& checked = *ch.checked;
  const AutoPlan& a = checked.plan;
  ch.rows.push_back({"chosen", a.best.plan, a.best.peak, a.predicted_step_ms});
  for (const auto& r : a.alternatives)
    ch.rows.push_back({"alternative", r.plan, r.peak, prof.none_step_ms + r.time_ms});
  if (a.smallest.plan != a.best.plan)
    ch.rows.push_back({"smallest peak", a.smallest.plan, a.smallest.peak, prof.none_step_ms + a.smallest.time_ms});
  std::printf("%-14s %-44s %16s %16s\n", "", "plan", "pred. peak MiB", "pred. step ms");
  for (const Row& r : ch.rows)
    std::printf("%-14s %-44s %16.1f %16.0f\n", r.role.c_str(), r.plan.c_str(), double(r.peak) / 1048576.0,
                r.step_ms);
  std::printf("(predicted from the profile; every plan listed fits the budget but the smallest-peak one, which is "
              "the least any plan reaches)\n");
  std::printf("checked: the chosen plan's run in a fresh model peaked at %s (%s the budget less the %.1f%% margin; "
              "%d choice%s)\n",
              format_mib(checked.measured_peak).c_str(), checked.checked ? "within" : "above", 100 * a.margin,
              checked.tries, checked.tries == 1 ? "" : "s");
  if (checked.history.size() > 1)
    for (const auto& [plan, peak] : checked.history)
      std::printf("  run: %-44s peaked at %s\n", plan.c_str(), format_mib(peak).c_str());
  return ch;
}

// The distinct plans of every budget's rows, in first-listed order; sets
// each row's index into them.
std::vector<std::string> plans_to_measure(std::vector<Choice>& choices) {
  std::vector<std::string> to_measure;
  for (Choice& ch : choices)
    for (Row& r : ch.rows) {
      const auto it = std::find(to_measure.begin(), to_measure.end(), r.plan);
      r.measured = std::size_t(it - to_measure.begin());
      if (it == to_measure.end()) to_measure.push_back(r.plan);
    }
  return to_measure;
}

// --measure: every plan (once, whichever budgets list it) in fresh bench
// processes, interleaved, a line per process; the medians per plan.
std::vector<Measured> measure_plans(const Flags& f, const PlanOptions& o, const std::vector<std::string>& plans) {
  std::vector<std::map<std::string, std::vector<double>>> v(plans.size());
  const std::int64_t repeats = f.get_int("repeats");
  const auto order = bench_order(std::int64_t(plans.size()), repeats);
  std::printf("\nmeasuring %zu plans x %lld processes (%lld warm-up + %lld timed steps each), interleaved\n",
              plans.size(), static_cast<long long>(repeats), static_cast<long long>(f.get_int("warmup")),
              static_cast<long long>(f.get_int("steps")));
  for (const BenchSlot& s : order) {
    const std::string& plan = plans[std::size_t(s.variant)];
    const auto m = run_worker(o.config, plan, f.get_int("warmup"), f.get_int("steps"), num_threads(), f.get("seed"),
                              WorkerRanks{}, dtype_name(o.dtype), o.device.str(), f.has("offload-dir") ? f.get("offload-dir") : "");
    for (const auto& [k, val] : m) v[std::size_t(s.variant)][k].push_back(val);
    std::printf("  [%2lld/%zu] %-44s step %.0f ms, peak %.1f MiB\n", static_cast<long long>(s.position + 1),
                order.size(), plan.c_str(), m.at("step_ms"), m.at("peak_allocated_bytes") / 1048576.0);
    std::fflush(stdout);
  }
  std::vector<Measured> med(plans.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    med[i] = {median(v[i].at("peak_allocated_bytes")), median(v[i].at("step_ms")), median(v[i].at("step_ms_best"))};
  return med;
}

// Each budget's rows, predicted next to measured.
void print_measured(const std::vector<Choice>& choices, const std::vector<Measured>& med) {
  for (const Choice& ch : choices) {
    if (ch.rows.empty()) continue;
    std::printf("\nbudget %s = %s\n%-14s %-44s %11s %11s %7s %9s %9s %7s %9s %7s %5s\n", ch.text.c_str(),
                format_mib(ch.budget).c_str(), "", "plan", "pred. MiB", "meas. MiB", "error", "pred. ms",
                "meas. ms", "error", "best ms", "error", "fits");
    for (const Row& r : ch.rows) {
      const Measured& m = med[r.measured];
      std::printf("%-14s %-44s %11.1f %11.1f %6.1f%% %9.0f %9.0f %6.1f%% %9.0f %6.1f%% %5s\n", r.role.c_str(),
                  r.plan.c_str(), double(r.peak) / 1048576.0, m.peak / 1048576.0,
                  100 * (double(r.peak) - m.peak) / m.peak, r.step_ms, m.step_ms,
                  100 * (r.step_ms - m.step_ms) / m.step_ms, m.step_ms_best,
                  100 * (r.step_ms - m.step_ms_best) / m.step_ms_best, m.peak <= double(ch.budget) ? "yes" : "NO");
    }
  }
  std::printf("(measured: medians over the processes; best ms: each process's fastest timed step, median over "
              "them; error = (predicted - measured) / measured)\n");
}

JsonObject candidate_json(const ProfiledCandidate& c) {
  JsonObject j;
  j.set("component", c.component.empty() ? std::string("none") : c.component).set("plan", c.plan);
  j.set("lossy", c.lossy).set("step_ms", c.step_ms).set("peak_allocated_bytes", c.peak);
  j.set("dispatch_bytes", c.dispatch_bytes).set("replay_dispatch_bytes", c.replay_dispatch_bytes);
  std::vector<JsonObject> blocks;
  for (std::size_t i = 0; i < c.blocks.size(); ++i) {
    const PlanChoice& b = c.blocks[i];
    JsonObject o;
    o.set("block", std::int64_t(i)).set("held_bytes", b.held).set("forward_work_bytes", b.forward_work);
    o.set("backward_work_bytes", b.work).set("time_ms", b.time_ms);
    blocks.push_back(o);
  }
  j.set_raw("blocks", json_array(blocks));
  return j;
}

// The --json document: the choice per budget (one budget: its keys at the top
// level; several: `budgets`, one object per budget with those keys, or
// `skipped`, why no plan fits), then the profile it was planned from.
class PlanJson {
 public:
  // `med`: the measured medians per plan (null without --measure).
  PlanJson(const PlanOptions& o, const PlanProfile& prof, const std::vector<Choice>& choices,
           const std::vector<Measured>* med)
      : o_(o), prof_(prof), choices_(choices), med_(med) {}

  void write(const std::string& path) const {
    JsonObject doc;
    doc.set("config", o_.model.name).set("ranks", o_.ranks).set("ep", o_.ep).set("zero", o_.zero);
    if (!o_.several()) budget_keys(doc, choices_[0]);
    doc.set("allow_lossy", o_.lossy).set("persistent_bytes", prof_.persistent).set("none_peak_bytes", prof_.none_peak);
    doc.set("zero_working_bytes", prof_.sharding_working);
    doc.set("none_activation_bytes", prof_.none_activation_bytes()).set("none_step_ms", prof_.none_step_ms);
    if (o_.several()) {
      std::vector<JsonObject> per;
      for (const Choice& ch : choices_) {
        JsonObject j;
        budget_keys(j, ch);
        per.push_back(j);
      }
      doc.set_raw("budgets", json_array(per));
    }
    profile_keys(doc);
    std::ofstream out(path);
    REMAT_CHECK(out.good(), IOError, "plan: cannot write ", path);
    out << doc.str() << "\n";
    std::printf("wrote %s\n", path.c_str());
  }

 private:
  void budget_keys(JsonObject& j, const Choice& ch) const {
    j.set("memory_budget", ch.text).set("budget_bytes", ch.budget);
    if (!ch.checked) {
      j.set("skipped", ch.skipped);
      return;
    }
    const AutoPlan& a = ch.checked->plan;
    j.set("chosen_plan", a.best.plan).set("predicted_peak_bytes", a.best.peak);
    j.set("predicted_step_ms", a.predicted_step_ms).set("checked_peak_bytes", ch.checked->measured_peak);
    j.set("margin", a.margin).set("planned_budget_bytes", a.planned_budget);
    std::vector<JsonObject> plans, measured_rows;
    for (const auto& r : ch.rows) {
      JsonObject p;
      p.set("role", r.role).set("plan", r.plan).set("predicted_peak_bytes", r.peak);
      p.set("predicted_step_ms", r.step_ms);
      plans.push_back(p);
      if (med_) measured_rows.push_back(measured_row(r, ch.budget));
    }
    j.set_raw("plans", json_array(plans));
    if (med_) j.set_raw("measured", json_array(measured_rows));
  }

  JsonObject measured_row(const Row& r, std::int64_t budget) const {
    JsonObject j;
    j.set("role", r.role).set("plan", r.plan).set("predicted_peak_bytes", r.peak).set("predicted_step_ms", r.step_ms);
    const Measured& m = (*med_)[r.measured];
    j.set("peak_allocated_bytes", m.peak).set("step_ms", m.step_ms).set("step_ms_best", m.step_ms_best);
    j.set("peak_error", (double(r.peak) - m.peak) / m.peak).set("step_error", (r.step_ms - m.step_ms) / m.step_ms);
    j.set("step_error_best", (r.step_ms - m.step_ms_best) / m.step_ms_best).set("fits", m.peak <= double(budget));
    return j;
  }

  // The planner's bases, every candidate and the traced step's saves.
  void profile_keys(JsonObject& doc) const {
    JsonObject bases;
    bases.set("forward_base", prof_.forward_base).set("block_forward_base", prof_.block_forward_base);
    bases.set("fixed_peak", prof_.fixed_peak);
    std::string bb = "[";
    for (std::size_t i = 0; i < prof_.backward_bases.size(); ++i)
      bb += (i ? ", " : "") + std::to_string(prof_.backward_bases[i]);
    bases.set_raw("backward_bases", bb + "]");
    bases.set("loss_peak", prof_.none_loss_peak);
    doc.set_raw("bases", bases.str());
    if (const ChunkedLossProfile& c = prof_.chunked_loss; c.measured) {
      JsonObject cl;
      cl.set("forward_base", c.forward_base).set("block_forward_base", c.block_forward_base);
      cl.set("fixed_peak", c.fixed_peak).set("loss_peak", c.loss_peak).set("extra_ms", c.extra_ms);
      std::string cb = "[";
      for (std::size_t i = 0; i < c.backward_bases.size(); ++i)
        cb += (i ? ", " : "") + std::to_string(c.backward_bases[i]);
      cl.set_raw("backward_bases", cb + "]");
      doc.set_raw("chunked_loss", cl.str());
    }
    if (const KeepGatheredProfile& k = prof_.keep_gathered; k.measured) {
      std::vector<JsonObject> blocks;
      for (std::size_t i = 0; i < k.delta.size(); ++i) {
        JsonObject b;
        b.set("block", std::int64_t(i)).set("held_bytes", k.delta[i].held);
        b.set("forward_work_bytes", k.delta[i].forward_work).set("backward_work_bytes", k.delta[i].work);
        b.set("time_ms", k.delta[i].time_ms);
        blocks.push_back(b);
      }
      doc.set_raw("keep_gathered", json_array(blocks));
    }
    std::vector<JsonObject> cands;
    for (const auto& cand : prof_.candidates) cands.push_back(candidate_json(cand));
    doc.set_raw("candidates", json_array(cands));
    std::vector<JsonObject> saves;
    for (const auto& s : prof_.saves) {
      JsonObject j;
      j.set("block", s.block).set("op", s.op).set("bytes", s.bytes).set("is_output", s.is_output);
      j.set("saved_at", s.saved_at).set("released_at", s.released_at);
      saves.push_back(j);
    }
    doc.set_raw("saves", json_array(saves));
  }

  const PlanOptions& o_;
  const PlanProfile& prof_;
  const std::vector<Choice>& choices_;
  const std::vector<Measured>* med_;
};

}  // namespace

int run_plan(const std::vector<std::string>& args) {
  Flags f("plan", "the plan --recompute auto would choose for --memory-budget (one budget or a comma list, planned "
          "from one profile), with predictions", args, plan_flag_specs());
  apply_threads_flag(f);
  const PlanOptions o = plan_options(f);
  REMAT_CHECK(!(o.device.is_meta() && f.get_bool("measure")), Error,
              "plan: --measure runs the plans for real; --device meta has no values to run (drop one)");
  const auto world = world_group();
  REMAT_CHECK(world->size() > 1 || (f.get_int("zero") == 0 && f.get_int("ep") == 1), Error,
              "plan: --zero and --ep say how the ranks of a job under mpirun run the profile; run it under "
              "`mpirun -np N` (one process has none)");
  REMAT_CHECK(world->size() == 1 || !f.get_bool("measure"), Error, "plan: --measure starts bench processes of "
              "its own; under mpirun use ./remat bench --dp N --zero S --recompute auto instead");
  // Under mpirun every rank profiles and chooses (the same plans); rank 0 reports.
  if (world->rank() != 0) REMAT_CHECK(std::freopen("/dev/null", "w", stdout) != nullptr, IOError,
                                      "plan: rank ", world->rank(), " cannot quiet its output");
  std::printf("remat plan: config %s, %d threads%s; profiling %lld rounds of each plan component on every block\n",
              o.model.name.c_str(), num_threads(),
              o.ranks > 1 ? fmt(", %lld ranks (--ep %lld, --zero %lld, --tp %lld%s)", static_cast<long long>(o.ranks),
                                static_cast<long long>(o.ep), static_cast<long long>(o.zero),
                                static_cast<long long>(f.get_int("tp")), f.get_bool("sp") ? " --sp" : "").c_str() : "",
              static_cast<long long>(f.get_int("profile-rounds")));
  std::fflush(stdout);
  const ProfileOptions popts = profile_options_for_flags(f, o.model, dtype_name(o.dtype), o.device, o.seed,
                                                        world->rank() == 0, {f.get_int("ep"), f.get_int("zero"), 1, f.get_int("tp"), f.get_bool("sp")});
  const PlanProfile prof = profile_plans(popts);
  for (const auto& b : o.budget_texts) parse_memory_budget(b, prof);  // a bad text is an error before any choice
  print_profile(prof);
  if (o.device.is_meta())
    std::printf("(--device meta: bytes are the step's own, exactly; step times are estimates for --device-model %s)\n",
                popts.device_model.c_str());

  std::vector<Choice> choices;
  for (const auto& text : o.budget_texts) choices.push_back(choose_for_budget(f, o, prof, popts, text));
  const std::vector<std::string> to_measure = plans_to_measure(choices);
  std::optional<std::vector<Measured>> measured;
  if (f.get_bool("measure") && !to_measure.empty()) {
    measured = measure_plans(f, o, to_measure);
    print_measured(choices, *measured);
  }
  if (f.has("json") && world->rank() == 0) PlanJson(o, prof, choices, measured ? &*measured : nullptr).write(f.get("json"));
  return 0;
}

}  // namespace remat::tools
