// The `./remat bench --html` page: memory against step time, one point per
// recompute plan, as a self-contained HTML/SVG page in the style of `mem`.
#pragma once

#include <string>
#include <vector>

namespace remat::tools {

struct BenchPoint {
  std::string plan;
  double step_ms = 0, step_ms_min = 0, step_ms_max = 0;
  double activation_bytes = 0, peak_allocated_bytes = 0;
  double mfu = 0, hfu = 0, time_ratio = 0, memory_ratio = 0;
};

// The page for `config`; `subtitle` says how it was measured.
std::string bench_html(const std::string& config, const std::string& subtitle, const std::vector<BenchPoint>& points);

}  // namespace remat::tools
