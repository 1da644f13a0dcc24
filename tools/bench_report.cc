#include "tools/bench_report.h"

#include <cstdio>
#include <fstream>

#include "engine/error.h"
#include "tools/bench_plot.h"
#include "tools/bench_worker.h"
#include "tools/html.h"

namespace remat::tools {

namespace {

// A plan row's figures derived from its medians.
struct PlanFigures {
  double step = 0, tps = 0, mfu = 0, hfu = 0;
  double replay_ms = 0, replay_fwd = 0, mem_ratio = 0, time_ratio = 0;
};

// The report over one run's measurements: the baseline plan's medians, read
// by every table, are taken once.
class BenchReport {
 public:
  BenchReport(const BenchOptions& o, const BenchMeasurements& m)
      : o_(o), m_(m), torch_(o.torch()), ti_(m.variants.size() - 1), peak_(m.peak_flops) {
    // The baseline for ratios: `none` if measured, else the first plan.
    for (std::size_t i = 0; i < m.plans.size(); ++i)
      if (m.plans[i] == "none") base_ = i;
    base_ms_ = med(base_, "step_ms");
    base_act_ = med(base_, "activation_bytes");
    base_bwd_ = med(base_, "backward_ms");
    base_fwd_ = med(base_, "forward_ms");
    torch_tps_ = torch_ ? med(ti_, "tokens") / (med(ti_, "step_ms") * 1e-3) : 0.0;
    // The best-step view: each process's fastest timed step, median over
    // repeats. Other load only ever slows a step, so on a shared machine the
    // fastest step is the least disturbed estimate of a variant's own time
    // (the minimum as the robust estimator under additive delays: Chen and
    // Revels, "Robust benchmarking in noisy environments", 2016).
    base_best_ = med(base_, "step_ms_best");
    torch_best_ = torch_ ? med(ti_, "step_ms_best") : 0.0;
  }

  void run() {
    std::vector<JsonObject> rows;
    std::vector<BenchPoint> points;
    plan_table(rows, points);
    const JsonObject torch_row = torch_ ? torch_line() : JsonObject();
    std::printf("(medians over repeats, [min-max] across them%s; activations = peak - persistent (parameters + "
                "gradients + optimizer state); replay = backward - %s's backward, rep/fwd in %s forwards; ratios "
                "against %s%s)\n",
                o_.seq_range ? ", of each process's mean step (its run's time over its steps: the lengths vary)" : "",
                base_plan().c_str(), base_plan().c_str(), base_plan().c_str(),
                torch_ ? fmt("; x torch: tokens/s over %s's", m_.framework.c_str()).c_str() : "");
    if (!o_.seq_range) best_step_table();  // (with varying lengths the fastest step is the shortest batch's)
    estimate_table();
    const std::vector<JsonObject> auto_rows = planner_table();
    if (o_.ep > 1) comm_table();
    if (o_.json_path) write_json(*o_.json_path, rows, torch_row, auto_rows);
    if (o_.html_path) write_html(*o_.html_path, points);
  }

 private:
  double med(std::size_t i, const char* k) const { return median(m_.samples[i].at(k)); }
  const std::vector<double>& all(std::size_t i, const char* k) const { return m_.samples[i].at(k); }
  const std::string& base_plan() const { return m_.plans[base_]; }

  PlanFigures figures(std::size_t i) const {
    PlanFigures p;
    p.step = med(i, "step_ms");
    p.tps = med(i, "tokens") / (p.step * 1e-3);
    p.mfu = med(i, "model_flops") / (p.step * 1e-3) / peak_;
    p.hfu = (med(i, "model_flops") + med(i, "replay_flops")) / (p.step * 1e-3) / peak_;
    p.replay_ms = med(i, "backward_ms") - base_bwd_;
    p.replay_fwd = base_fwd_ > 0 ? p.replay_ms / base_fwd_ : 0.0;
    p.mem_ratio = base_act_ > 0 ? med(i, "activation_bytes") / base_act_ : 0.0;
    p.time_ratio = p.step / base_ms_;
    return p;
  }

  // The time estimate next to the measured step, per plan (CPU runs).
  void estimate_table() const {
    if (m_.plans.empty() || med(0, "estimated_step_ms") <= 0) return;
    std::printf("\ntime estimate (an estimate: the op table's costs on this machine's measured GEMM peak and memory\n"
                "bandwidth, checkpoint/time_estimate.h) next to the measured median step:\n");
    std::printf("%-32s %12s %12s %9s\n", "plan", "estimate ms", "measured ms", "error");
    for (std::size_t i = 0; i < m_.plans.size(); ++i) {
      const double est = med(i, "estimated_step_ms"), step = med(i, "step_ms");
      std::printf("%-32s %12.1f %12.1f %+8.1f%%\n", m_.plans[i].c_str(), est, step, 100 * (est / step - 1));
    }
  }

  // The per-plan table; each plan's --json row and --html point.
  void plan_table(std::vector<JsonObject>& rows, std::vector<BenchPoint>& points) const {
    std::printf("\n%-20s %9s %9s %9s %22s %8s %8s %8s %7s %8s %6s %6s %8s %7s %7s%s\n", "plan", "peak MiB", "activ.",
                "loss", "step ms [min-max]", "fwd ms", "bwd ms", "replay", "rep/fwd", "tok/s", "MFU", "HFU", "recomp.",
                "x time", "x mem", torch_ ? "  x torch" : "");
    for (std::size_t i = 0; i < m_.plans.size(); ++i) {
      const PlanFigures p = figures(i);
      rows.push_back(plan_json(i, p));
      points.push_back(plan_point(i, p));
      const auto& sv = all(i, "step_ms");
      const std::string spread = fmt("%.0f [%.0f-%.0f]", p.step, min_of(sv), max_of(sv));
      std::printf("%-20s %9.1f %9.1f %9.1f %22s %8.0f %8.0f %8.0f %7.2f %8.0f %5.1f%% %5.1f%% %8.0f %6.2fx %6.2fx%s\n",
                  m_.plans[i].c_str(), med(i, "peak_allocated_bytes") / 1048576.0,
                  med(i, "activation_bytes") / 1048576.0, med(i, "loss_bytes") / 1048576.0, spread.c_str(), med(i, "forward_ms"),
                  med(i, "backward_ms"), p.replay_ms, p.replay_fwd, p.tps, 100 * p.mfu, 100 * p.hfu,
                  med(i, "recomputed_ops"), p.time_ratio, p.mem_ratio,
                  torch_ ? fmt("  %6.2fx", p.tps / torch_tps_).c_str() : "");
    }
  }

  JsonObject plan_json(std::size_t i, const PlanFigures& p) const {
    auto med = [&](const char* k) { return this->med(i, k); };
    const auto& sv = all(i, "step_ms");
    JsonObject j;
    j.set("plan", m_.plans[i]).set("config", o_.model.name).set("repeats", o_.repeats).set("threads", o_.threads);
    j.set("dtype", dtype_name(o_.dtype));
    j.set("device", o_.device.str());
    if (o_.seq_range) j.set("seq_min", o_.seq_range->min).set("seq_max", o_.seq_range->max);  // (tokens: their mean)
    j.set("peak_allocated_bytes", med("peak_allocated_bytes")).set("peak_reserved_bytes", med("peak_reserved_bytes"));
    j.set("persistent_bytes", med("persistent_bytes")).set("activation_bytes", med("activation_bytes"));
    j.set("loss_bytes", med("loss_bytes"));
    j.set("step_ms", p.step).set("step_ms_min", min_of(sv)).set("step_ms_max", max_of(sv));
    j.set("forward_ms", med("forward_ms")).set("forward_ms_min", min_of(all(i, "forward_ms")));
    j.set("forward_ms_max", max_of(all(i, "forward_ms")));
    j.set("backward_ms", med("backward_ms")).set("backward_ms_min", min_of(all(i, "backward_ms")));
    j.set("backward_ms_max", max_of(all(i, "backward_ms")));
    j.set("replay_ms", p.replay_ms).set("replay_forwards", p.replay_fwd).set("replay_wall_ms", med("replay_wall_ms"));
    j.set("tokens_per_s", p.tps).set("recomputed_ops", med("recomputed_ops"));
    j.set("replayed_comm_bytes", med("replayed_comm_bytes")).set("mfu", p.mfu).set("hfu", p.hfu);
    j.set("offloaded_bytes", med("offloaded_bytes")).set("offload_ms", med("offload_ms"));
    if (m_.samples[i].count("peak_allocated_bytes_rank0"))  // (several ranks)
      j.set("peak_allocated_bytes_rank0", med("peak_allocated_bytes_rank0"));
    for (const char* k : {"rss_peak_bytes", "spill_page_cache_bytes"})  // (a baseline's rows have none)
      j.set(k, m_.samples[i].count(k) ? med(k) : 0.0);
    for (const char* k : {"memory_budget_bytes", "budget_headroom_bytes", "evictions", "evicted_bytes", "rebuilds",
                          "rebuild_ms"})  // (dynamic rows only)
      if (m_.samples[i].count(k)) j.set(k, med(k));
    j.set("compressed_saved_bytes", med("compressed_saved_bytes"));
    j.set("model_flops", med("model_flops")).set("recomputed_flops", med("replay_flops")).set("peak_flops", peak_);
    j.set("time_ratio", p.time_ratio).set("memory_ratio", p.mem_ratio);
    // The cpu-measured roofline estimate of the same step, and how far it is
    // from the measured median (checkpoint/time_estimate.h); 0 off the CPU.
    const double est = med("estimated_step_ms");
    j.set("estimated_step_ms", est).set("estimate_error", est > 0 ? est / p.step - 1 : 0.0);
    if (torch_) j.set("torch_ratio", p.tps / torch_tps_);
    j.set("step_ms_best", med("step_ms_best")).set("time_ratio_best", med("step_ms_best") / base_best_);
    if (torch_) j.set("torch_ratio_best", torch_best_ / med("step_ms_best"));  // equal tokens per step
    if (m_.autos.count(i)) {
      const AutoPlan& a = m_.autos.at(i).choice;
      j.set("chosen_plan", a.best.plan).set("memory_budget", m_.autos.at(i).budget_text).set("budget_bytes", a.budget);
      j.set("predicted_peak_bytes", a.best.peak).set("predicted_step_ms", a.predicted_step_ms);
    }
    if (o_.dp > 1) {
      j.set("dp", o_.dp).set("zero", o_.zero);
      for (const char* k : {"comm_bytes_forward", "comm_bytes_backward", "comm_bytes_replay", "all_gather_calls_forward",
                            "all_gather_bytes_forward", "all_gather_calls_backward", "all_gather_bytes_backward",
                            "all_gather_calls_replay", "all_gather_bytes_replay", "reduce_scatter_calls_backward",
                            "reduce_scatter_bytes_backward", "zero_comm_wait_ms"})
        j.set(k, med(k));
    }
    if (m_.samples[i].count("tp")) {  // (a worker under --tp T > 1)
      // Per rank (the fullest): activation_bytes; next to the fraction of one
      // process's activations that Korthikanti et al. (2022) give a rank:
      // (10 + 24/t) / 34 with tensor parallelism, 1/t with --sp.
      const double t = med("tp");
      const bool sp = med("sp") > 0;
      j.set("tp", t).set("sp", sp).set("activation_formula_fraction", sp ? 1 / t : (10 + 24 / t) / 34);
      for (const char* k : {"comm_bytes_forward", "comm_bytes_backward", "comm_bytes_replay"}) j.set(k, med(k));
      for (const char* kind : {"all_reduce", "all_gather", "reduce_scatter"})
        for (const char* ph : {"forward", "backward", "replay"})
          for (const char* what : {"calls", "bytes"}) {
            const std::string k = std::string(kind) + "_" + what + "_" + ph;
            j.set(k, med(k.c_str()));
          }
    }
    if (o_.ep > 1) {
      j.set("ep", o_.ep);
      for (const char* k : {"comm_bytes_forward", "comm_bytes_backward", "comm_bytes_replay", "all_to_all_bytes_forward",
                            "all_to_all_bytes_replay", "all_to_all_calls_replay"})
        j.set(k, med(k));
    }
    return j;
  }

  BenchPoint plan_point(std::size_t i, const PlanFigures& p) const {
    const auto& sv = all(i, "step_ms");
    BenchPoint bp;
    bp.plan = m_.plans[i];
    bp.step_ms = p.step;
    bp.step_ms_min = min_of(sv);
    bp.step_ms_max = max_of(sv);
    bp.activation_bytes = med(i, "activation_bytes");
    bp.peak_allocated_bytes = med(i, "peak_allocated_bytes");
    bp.mfu = p.mfu;
    bp.hfu = p.hfu;
    bp.time_ratio = p.time_ratio;
    bp.memory_ratio = p.mem_ratio;
    if (m_.autos.count(i)) {
      const AutoPlan& a = m_.autos.at(i).choice;
      bp.is_auto = true;
      bp.chosen_plan = a.best.plan;
      bp.budget_bytes = double(a.budget);
      bp.predicted_peak_bytes = double(a.best.peak);
      bp.predicted_step_ms = a.predicted_step_ms;
    }
    return bp;
  }

  // The PyTorch baseline's line of the plan table; its --json object.
  JsonObject torch_line() const {
    const auto& sv = all(ti_, "step_ms");
    const double step = med(ti_, "step_ms");
    const double mfu = med(base_, "model_flops") / (step * 1e-3) / peak_;
    const std::string spread = fmt("%.0f [%.0f-%.0f]", step, min_of(sv), max_of(sv));
    std::printf("%-20s %9s %9s %9s %22s %8.0f %8.0f %8s %7s %8.0f %5.1f%%\n", "torch", "-", "-", "-", spread.c_str(),
                med(ti_, "forward_ms"), med(ti_, "backward_ms"), "-", "-", torch_tps_, 100 * mfu);
    JsonObject j;
    j.set("framework", m_.framework).set("step_ms", step).set("step_ms_min", min_of(sv));
    j.set("step_ms_max", max_of(sv)).set("forward_ms", med(ti_, "forward_ms"));
    j.set("backward_ms", med(ti_, "backward_ms")).set("tokens_per_s", torch_tps_);
    j.set("mfu", mfu);
    j.set("step_ms_best", torch_best_);
    return j;
  }

  // Each variant's fastest step (median [min-max] over repeats) and ratios.
  void best_step_table() const {
    std::printf("\n%-24s %14s %8s%s\n", "best step", "ms [min-max]", "x time", torch_ ? "  x torch" : "");
    for (std::size_t i = 0; i < m_.variants.size(); ++i) {
      const bool is_torch = torch_ && i == ti_;
      const auto& bv = all(i, "step_ms_best");
      const double b = median(bv);
      std::printf("%-24s %14s %8s%s\n", m_.variants[i].c_str(),
                  fmt("%.0f [%.0f-%.0f]", b, min_of(bv), max_of(bv)).c_str(),
                  is_torch ? "-" : fmt("%.2fx", b / base_best_).c_str(),
                  !torch_ ? "" : is_torch ? "        -" : fmt("  %6.2fx", torch_best_ / b).c_str());
    }
    std::printf("(each process's fastest timed step, median [min-max] over repeats: other load only slows steps, so "
                "on a shared machine this is the least disturbed figure)\n");
  }

  // The fastest hand plan whose measured peak fits `budget`, by the median of
  // `key` (step_ms, or step_ms_best for the best-step view); plans.size() if
  // none fits.
  std::size_t fastest_fitting(std::int64_t budget, const char* key) const {
    std::size_t best = m_.plans.size();
    for (std::size_t k = 0; k < m_.plans.size(); ++k)
      if (!m_.autos.count(k) && med(k, "peak_allocated_bytes") <= double(budget) &&
          (best == m_.plans.size() || med(k, key) < med(best, key)))
        best = k;
    return best;
  }

  // The planner's rows, each against the fastest other (hand) plan whose
  // measured peak fits the same budget; their --json objects.
  std::vector<JsonObject> planner_table() const {
    std::vector<JsonObject> auto_rows;
    if (m_.autos.empty()) return auto_rows;
    std::printf("\n%-12s %10s %-40s %9s %9s %8s %8s %5s  %-26s %8s %7s  %-26s %8s\n", "planner", "budget MiB",
                "chosen plan", "pred. MiB", "meas. MiB", "pred. ms", "meas. ms", "fits", "fastest hand plan that fits",
                "its ms", "x time", "best step: fastest that fits", "x time");
    for (const auto& [i, ar] : m_.autos) auto_rows.push_back(planner_row(i, ar));
    std::printf("(fits: measured peak <= budget; x time: the auto row's step over the fastest hand plan whose "
                "measured peak fits the same budget, both medians of this run; then the same in the best-step "
                "view)\n");
    return auto_rows;
  }

  JsonObject planner_row(std::size_t i, const AutoRow& ar) const {
    const std::vector<std::string>& plans = m_.plans;
    const AutoPlan& a = ar.choice;
    const double mp = med(i, "peak_allocated_bytes"), ms = med(i, "step_ms");
    const std::size_t best = fastest_fitting(a.budget, "step_ms"), best_b = fastest_fitting(a.budget, "step_ms_best");
    const bool any = best < plans.size();
    const double hand_ms = any ? med(best, "step_ms") : 0.0;
    const double ms_b = med(i, "step_ms_best"), hand_b = any ? med(best_b, "step_ms_best") : 0.0;
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
    return j;
  }

  // --ep: rank 0's collectives per step, by phase.
  void comm_table() const {
    std::printf("\n%d ranks (expert parallel %lld), rank 0's collectives per step, MiB sent:\n%-24s %10s %10s %10s "
                "%12s %12s\n",
                int(o_.ep), static_cast<long long>(o_.ep), "plan", "forward", "backward", "replay", "a2a forward",
                "a2a replay");
    for (std::size_t i = 0; i < m_.plans.size(); ++i) {
      auto mib = [&](const char* k) { return med(i, k) / 1048576.0; };
      std::printf("%-24s %10.2f %10.2f %10.2f %12.2f %12.2f\n", m_.plans[i].c_str(), mib("comm_bytes_forward"),
                  mib("comm_bytes_backward"), mib("comm_bytes_replay"), mib("all_to_all_bytes_forward"),
                  mib("all_to_all_bytes_replay"));
    }
  }

  void write_json(const std::string& path, const std::vector<JsonObject>& rows, const JsonObject& torch_row,
                  const std::vector<JsonObject>& auto_rows) const {
    JsonObject doc;
    doc.set("config", o_.model.name).set("device", o_.device.str()).set("dtype", dtype_name(o_.dtype));
    doc.set("threads", o_.threads);
    if (o_.seq_range) doc.set("seq_min", o_.seq_range->min).set("seq_max", o_.seq_range->max);
    doc.set("repeats", o_.repeats).set("warmup", o_.warmup).set("steps", o_.steps).set("order", "williams");
    doc.set("baseline_plan", base_plan()).set("peak_flops", peak_);
    doc.set_raw("rows", json_array(rows));
    if (torch_) doc.set_raw("torch", torch_row.str());
    doc.set_raw("runs", json_array(m_.runs));
    if (!auto_rows.empty()) doc.set_raw("auto", json_array(auto_rows));
    std::ofstream out(path);
    REMAT_CHECK(out.good(), IOError, "bench: cannot write ", path);
    out << doc.str() << "\n";
    std::printf("wrote %s\n", path.c_str());
  }

  void write_html(const std::string& path, const std::vector<BenchPoint>& points) const {
    std::ofstream out(path);
    REMAT_CHECK(out.good(), IOError, "bench: cannot write ", path);
    out << bench_html(o_.model.name,
                      fmt("%d threads, %lld fresh processes per plan x %lld timed steps, interleaved; ratios "
                          "against %s", o_.threads, static_cast<long long>(o_.repeats),
                          static_cast<long long>(o_.steps), base_plan().c_str()),
                      points);
    std::printf("wrote %s\n", path.c_str());
  }

  const BenchOptions& o_;
  const BenchMeasurements& m_;
  const bool torch_;
  const std::size_t ti_;  // the baseline's variant (the last), when torch_
  const double peak_;
  std::size_t base_ = 0;  // the plan the ratios are against
  double base_ms_ = 0, base_act_ = 0, base_bwd_ = 0, base_fwd_ = 0, torch_tps_ = 0, base_best_ = 0, torch_best_ = 0;
};

}  // namespace

void report_bench(const BenchOptions& o, const BenchMeasurements& m) { BenchReport(o, m).run(); }

}  // namespace remat::tools
