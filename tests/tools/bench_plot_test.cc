// tools/bench_plot: the Pareto frontier over (step time, peak allocated) and
// the `bench --html` page's frontier, auto-row markers and planner table.
#include "tools/bench_plot.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

using remat::tools::bench_html;
using remat::tools::BenchPoint;
using remat::tools::pareto_frontier;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

BenchPoint point(const std::string& plan, double step_ms, double peak_mib) {
  BenchPoint p;
  p.plan = plan;
  p.step_ms = p.step_ms_min = p.step_ms_max = step_ms;
  p.peak_allocated_bytes = peak_mib * kMiB;
  p.activation_bytes = peak_mib * kMiB / 2;
  return p;
}

BenchPoint auto_point(const std::string& plan, double step_ms, double peak_mib, double budget_mib,
                      const std::string& chosen) {
  BenchPoint p = point(plan, step_ms, peak_mib);
  p.is_auto = true;
  p.chosen_plan = chosen;
  p.budget_bytes = budget_mib * kMiB;
  p.predicted_peak_bytes = (peak_mib - 1) * kMiB;
  p.predicted_step_ms = step_ms - 2;
  return p;
}

bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

int count(const std::string& s, const std::string& sub) {
  int n = 0;
  for (auto at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
  return n;
}

}  // namespace

TEST_CASE("pareto_frontier: dominated points are left out, the rest sorted by step time", "[bench]") {
  const std::vector<BenchPoint> pts = {
      point("per_block", 150, 40),  // 0: on it
      point("none", 100, 100),      // 1: fastest, on it
      point("worse", 160, 60),      // 2: dominated by 0 in both
      point("chunk", 200, 20),      // 3: least memory, on it
      point("same_peak", 170, 40),  // 4: dominated by 0 (equal peak, slower)
      point("same_time", 150, 45),  // 5: dominated by 0 (equal time, more memory)
  };
  CHECK(pareto_frontier(pts) == std::vector<std::size_t>{1, 0, 3});
}

TEST_CASE("pareto_frontier: identical pairs keep the first, empty and non-finite inputs", "[bench]") {
  CHECK(pareto_frontier({}).empty());
  CHECK(pareto_frontier({point("only", 5, 5)}) == std::vector<std::size_t>{0});
  // The same (step, peak) twice: only the first index, wherever the pair sorts.
  CHECK(pareto_frontier({point("b", 20, 10), point("a", 10, 30), point("b2", 20, 10)}) ==
        std::vector<std::size_t>{1, 0});
  CHECK(pareto_frontier({point("x", 10, 10), point("x2", 10, 10), point("x3", 10, 10)}) ==
        std::vector<std::size_t>{0});
  // A NaN step time would break the ordering; such a point is never on it.
  CHECK(pareto_frontier({point("nan", std::nan(""), 1), point("ok", 10, 10)}) == std::vector<std::size_t>{1});
  CHECK(pareto_frontier({point("inf", 10, std::numeric_limits<double>::infinity()), point("ok", 20, 10)}) ==
        std::vector<std::size_t>{1});
}

TEST_CASE("bench_html without auto rows: frontier, frontier column, no planner table", "[bench]") {
  const std::vector<BenchPoint> pts = {point("none", 100, 100), point("worse", 160, 120), point("chunk", 200, 20)};
  const std::string h = bench_html("tiny", "measured somehow", pts);
  CHECK(has(h, "Pareto frontier (peak allocated)"));
  CHECK(has(h, "<polyline"));
  CHECK(has(h, "<th>frontier</th>"));
  // Two rows are on the frontier, the dominated one has a blank cell.
  CHECK(count(h, "<td>yes</td>") == 2);
  CHECK(count(h, "<td></td></tr>") == 1);
  CHECK_FALSE(has(h, "Planner (--recompute auto)"));
  CHECK_FALSE(has(h, "budget "));
  CHECK_FALSE(has(h, "<polygon"));
}

TEST_CASE("bench_html with an auto row: diamond, budget line and label, planner table", "[bench]") {
  const std::vector<BenchPoint> pts = {point("none", 100, 100), point("chunk", 200, 20),
                                       auto_point("auto<1>", 150, 50, 300, "selective:mlp&attn")};
  const std::string h = bench_html("tiny", "measured somehow", pts);
  CHECK(has(h, "Pareto frontier (peak allocated)"));
  CHECK(has(h, "<polygon"));
  CHECK(has(h, "stroke-dasharray=\"6 4\""));
  // Label and plan names are escaped.
  CHECK(has(h, "budget auto&lt;1&gt;"));
  CHECK_FALSE(has(h, "auto<1>"));
  CHECK(has(h, "<h2>Planner (--recompute auto)</h2>"));
  CHECK(has(h, "<td><code>selective:mlp&amp;attn</code></td>"));
  // Budget 300 MiB, predicted peak 49, measured 50, predicted step 148, measured 150: fits.
  CHECK(has(h, "<td class=\"n\">300.0</td><td><code>selective:mlp&amp;attn</code></td><td class=\"n\">49.0</td>"
               "<td class=\"n\">50.0</td><td class=\"n\">148.0</td><td class=\"n\">150.0</td><td>yes</td></tr>"));
  // The budget (300 MiB) is above every peak and the y axis still reaches past it (top tick 400; 150 without it).
  CHECK(has(h, ">400</text>"));
  // All three points are on the frontier.
  CHECK(count(h, "<td>yes</td>") == 3 + 1);  // three in the per-plan table, one "fits"
}

TEST_CASE("bench_html: an auto row over its budget does not fit", "[bench]") {
  const std::vector<BenchPoint> pts = {auto_point("auto", 150, 50, 40, "chunk")};
  const std::string h = bench_html("tiny", "", pts);
  CHECK(has(h, "<td>NO</td></tr>"));
  CHECK(has(h, "budget auto"));
}
