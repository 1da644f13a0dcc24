// ./remat bench-ops: throughput of the CPU kernels at transformer shapes,
// one row per case, each naming the op it times (every op in the op table
// has a row; tests/ops/op_coverage_test.cc checks it).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace remat::tools {

struct BenchOpCase {
  std::string kind;     // "gemm" and "attention" report GFLOP/s, "memory" GB/s
  std::string name;     // the row's label: the shape or variant
  std::string op;       // the op table name it times
  std::string backend;  // the GEMM back end or the kernel variant ("" if one)
  // Builds the inputs; returns the call to time.
  std::function<std::function<void()>()> setup;
  // FLOPs or bytes of one call; 0: the op's own cost (engine/op_def.h) for one call.
  double work = 0;
  int warmup = 2;
};

// Every case, in the order bench-ops runs them.
const std::vector<BenchOpCase>& bench_op_cases();

// `count` i64 ids (i * 7919) mod n.
Tensor remainder_ids(std::int64_t count, std::int64_t n);

// Prints a table (GFLOP/s for GEMMs and attention, GB/s for memory-bound ops;
// medians over repeats) and writes --json FILE. Returns the exit status.
int run_bench_ops(const std::vector<std::string>& args);

}  // namespace remat::tools
