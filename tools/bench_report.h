// ./remat bench's report: from the workers' results per variant, the tables
// (per plan, the PyTorch baseline, the best-step view, the planner's rows,
// --ep's collectives), the --json document and the --html page.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "tools/bench_options.h"
#include "tools/json.h"
#include "train/auto_plan.h"

namespace remat::tools {

// A planner row (--recompute auto): its --memory-budget item and the choice.
struct AutoRow {
  std::string budget_text;
  AutoPlan choice;
};

// What a bench run measured.
struct BenchMeasurements {
  std::vector<std::string> plans;        // the rows: hand plans, and auto rows named "auto" or "auto B"
  std::map<std::size_t, AutoRow> autos;  // plan index -> its planner choice
  std::vector<std::string> variants;     // the plans, then "torch" with the baseline
  // Per variant, each result field (bench_worker.h) over the repeats.
  std::vector<std::map<std::string, std::vector<double>>> samples;
  std::vector<JsonObject> runs;          // one per process, in execution order
  std::string framework;                 // what the PyTorch baseline named itself
  double peak_flops = 0;                 // for MFU and HFU
};

// Prints the tables (medians and [min-max] over repeats, ratios against plan
// none if measured, else the first plan) and writes o.json_path and
// o.html_path when set.
void report_bench(const BenchOptions& o, const BenchMeasurements& m);

}  // namespace remat::tools
