// ./remat bench-ops: throughput of the CPU kernels at transformer shapes.
#pragma once

#include <string>
#include <vector>

namespace remat::tools {

// Prints a table (GFLOP/s for GEMMs and attention, GB/s for memory-bound ops;
// medians over repeats) and writes --json FILE. Returns the exit status.
int run_bench_ops(const std::vector<std::string>& args);

}  // namespace remat::tools
