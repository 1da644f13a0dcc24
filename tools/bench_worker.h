// The fresh measurement processes of ./remat bench (`bench-worker`), for the
// commands that measure plans the same way (bench, plan --measure).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace remat::tools {

// Runs shell command `cmd` (`what` names it in errors) and returns its
// output; its exit status goes to *rc.
std::string run_capture(const std::string& cmd, const char* what, int* rc);

// Runs a measurement command (`what` names it in errors) and returns the
// numeric fields of the JSON object on its "BENCH-RESULT " line. Throws
// Error, with the command's output, if it fails or prints no such line.
std::map<std::string, double> run_bench_result(const std::string& cmd, const std::string& what);

// The median of `v` (the mean of the middle two for an even count; 0 if empty).
double median(std::vector<double> v);
// The least and greatest of `v` (which must not be empty).
double min_of(const std::vector<double>& v);
double max_of(const std::vector<double>& v);

// The processes of one worker: ep-way expert parallel over dp data-parallel
// ranks (dp 1: ep ranks), with ZeRO stage `zero` over them.
struct WorkerRanks {
  std::int64_t ep = 1, dp = 1, zero = 0, tp = 1;
  bool sp = false;
  std::int64_t processes() const { return (dp > 1 ? dp : ep) * tp; }
};

// One worker process (this binary as `bench-worker`): `warmup` untimed and
// `steps` timed training steps of `config` under `plan`; its result fields
// (step_ms, forward_ms, backward_ms, peak_allocated_bytes, persistent_bytes,
// activation_bytes, ...: docs/REFERENCE.md#file-formats). With several
// ranks, ranks.processes() processes under mpirun (threads split between
// them); rank 0 reports. `seq_range` ("MIN:MAX", or empty): every step's
// batch draws its length from it (the model built for MAX), the same lengths
// in every worker of the same seed; tokens and model_flops are then the
// means over the timed steps. Throws Error, with the worker's output, if it
// fails.
std::map<std::string, double> run_worker(const std::string& config, const std::string& plan, std::int64_t warmup,
                                         std::int64_t steps, int threads, const std::string& seed,
                                         WorkerRanks ranks = {}, const std::string& dtype = "f32",
                                         const std::string& device = "cpu", const std::string& offload_dir = "",
                                         const std::string& seq_range = "");

}  // namespace remat::tools
