// The `./remat bench --html` page: memory against step time, one point per
// recompute plan, as a self-contained HTML/SVG page in the style of `mem`,
// with the Pareto frontier and the memory-budget (`--recompute auto`) rows.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace remat::tools {

struct BenchPoint {
  std::string plan;
  double step_ms = 0, step_ms_min = 0, step_ms_max = 0;
  double activation_bytes = 0, peak_allocated_bytes = 0;
  double mfu = 0, hfu = 0, time_ratio = 0, memory_ratio = 0;
  // A row of `--recompute auto`: the plan the planner chose for the memory
  // budget, and what it predicted that plan would use and take.
  bool is_auto = false;
  std::string chosen_plan;
  double budget_bytes = 0;
  double predicted_peak_bytes = 0, predicted_step_ms = 0;
};

// Indices of the points no other point dominates in (step_ms, peak_allocated_bytes)
// (<= in both, < in one), by increasing step_ms; of identical pairs only the first
// is kept, and points with a non-finite step_ms or peak are never on it.
std::vector<std::size_t> pareto_frontier(const std::vector<BenchPoint>& points);

// The page for `config`; `subtitle` says how it was measured. Draws the
// frontier through the peak-allocated markers, auto rows as diamonds with
// their budget as a dashed line, and a planner table when any auto row exists.
std::string bench_html(const std::string& config, const std::string& subtitle, const std::vector<BenchPoint>& points);

}  // namespace remat::tools
