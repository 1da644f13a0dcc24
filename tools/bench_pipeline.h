// ./remat bench --pp P: pipeline stages under mpirun, each variant (a
// schedule and a recompute plan) in fresh jobs of P processes, interleaved as
// the plain bench; per stage: peak and activation bytes, micro-batches in
// flight, forward / backward / idle (the bubble) time and bytes sent.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace remat::tools {

struct PipelineBenchSpec {
  std::string config;                  // name or FILE.json
  std::vector<std::string> schedules;  // "gpipe", "1f1b"
  std::vector<std::string> plans;      // recompute plans
  std::int64_t pp = 2, micro_batches = 4, micro_rows = 1;  // the batch is micro_rows x micro_batches sequences
  std::int64_t warmup = 1, steps = 3, repeats = 2;
  int threads = 1;                     // in all: each of the P processes gets threads / P (at least 1)
  std::string seed = "0", dtype = "f32", json_path;
};

// Runs every schedule x plan `repeats` times in a balanced interleaved order,
// prints the per-stage table next to the bubble's arithmetic (P - 1) / (M +
// P - 1) and writes `json_path` if set (docs/REFERENCE.md#file-formats). Error
// naming the worker's output if one fails.
int run_pipeline_bench(const PipelineBenchSpec& spec);

// The job bench --pp starts (internal `bench-pipeline-worker`, under mpirun):
// warm-up and timed steps of the trainer with --pp; rank 0 prints
// "BENCH-RESULT {json}" with step_ms and every stage's medians (s<K>_...).
int run_bench_pipeline_worker(const std::vector<std::string>& args);

}  // namespace remat::tools
