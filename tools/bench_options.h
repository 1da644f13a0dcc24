// ./remat bench's flags, and what they become: the options of a plain bench
// run (checked once, before any measurement) or the spec of a pipeline bench
// (--pp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/dtype.h"
#include "models/config.h"
#include "tools/args.h"
#include "tools/bench_pipeline.h"
#include "train/data.h"

namespace remat::tools {

// The flags bench accepts (with the --recompute auto ones).
std::vector<FlagSpec> bench_flag_specs();

// Splits "none,selected:0,2,per_block" into plans: a piece that does not
// start a plan continues the previous one (selective:mlp,layernorm).
std::vector<std::string> split_plans(const std::string& s);

// bench --pareto's plans for `c`: the hand plans, each also with offload
// where the pair is a plan; under --zero 3 (`zero`) keep_gathered on every
// block and on the later half, each alone and with per_block; then auto.
std::vector<std::string> pareto_plans(const ModelConfig& c, std::int64_t zero = 0);

// bench --pp P's spec from the flags (threads applied). Error for a flag a
// pipeline bench does not measure, a device other than the CPU, or a bad plan.
PipelineBenchSpec pipeline_bench_spec(const Flags& f, const std::string& config, const ModelConfig& c);

enum class BenchBaseline { none, torch };

// A plain (not --pp) bench run.
struct BenchOptions {
  std::string config;               // --config as given (the workers load it again)
  ModelConfig model;                // it, loaded
  std::vector<std::string> plans;   // --recompute (or --pareto's hand plans), "auto" among them for planner rows
  std::vector<std::string> budgets; // --memory-budget's items: one auto row each
  bool pareto = false, has_auto = false, estimate = false;
  bool has_dynamic = false;  // a plan with dynamic and no budget: one row per budget
  std::int64_t repeats = 1, warmup = 0, steps = 1, ep = 1;
  std::int64_t dp = 1, zero = 0;    // --dp D (the processes of a worker) and --zero S over them
  // --tp T[+sp],...: the tensor-parallel layouts, each a worker of T times
  // the processes splitting every block (models/tensor_parallel.h), with
  // sequence parallelism for "+sp"; every plan runs under each of them.
  struct TpLayout {
    std::int64_t t = 1;
    bool sp = false;
  };
  std::vector<TpLayout> tp_layouts{TpLayout{}};
  int threads = 1;                  // num_threads() once --threads is applied
  std::uint64_t seed = 0;
  DType dtype = DType::f32;
  Device device;                    // cpu, cuda, or meta (only with --estimate)
  std::string device_model = "cpu-measured";  // --device-model: --estimate's time estimate
  BenchBaseline baseline = BenchBaseline::none;
  std::optional<double> peak_flops; // --peak-flops
  std::optional<std::string> json_path, html_path;  // --json, --html
  std::string offload_dir;                          // "" when not given
  // --seq-range MIN:MAX: every step's batch draws its length from the range
  // (model.seq is MAX); every worker draws the same lengths from --seed, so
  // the plans are compared on identical batches.
  std::optional<SeqRange> seq_range;
  std::string seq_range_text() const { return seq_range ? remat::seq_range_text(*seq_range) : ""; }

  // The baseline's column ("torch") is in the tables.
  bool torch() const { return baseline == BenchBaseline::torch; }
};

// The options from the flags (threads applied), every combination checked
// before any run: bad plans, auto without a budget (or a budget without
// auto), --pp-only flags, a device that is not there, --ep that does not
// divide the experts and batch, --estimate off the CPU and meta or in another
// dtype, meta without --estimate,
// and --baseline other than torch or on a model it cannot reproduce;
// --seq-range (model.seq becomes MAX) with --estimate, --baseline torch, a
// +sp layout, or auto on several processes.
BenchOptions bench_options(const Flags& f, const std::string& config, const ModelConfig& c);

}  // namespace remat::tools
