// The remat command-line tool (run through ./remat, which builds it first).
// Every command returns an exit status; errors print one clear line.
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/allocator.h"
#include "engine/device_runtime.h"
#include "engine/error.h"
#include "engine/parallel_for.h"
#include "engine/tensor.h"
#include "parallel/process_group.h"
#include "tools/args.h"
#include "tools/bench_ops.h"
#include "tools/bench_pipeline.h"
#include "tools/commands.h"
#include "tools/comm_watchdog.h"

namespace {

using Args = std::vector<std::string>;

int cmd_info(const Args& args) {
  remat::tools::Flags f("info", "show the build (CUDA or not), devices, threads and allocator", args, {});
  std::printf("remat\n");
  std::printf("  CUDA back end : %s\n", remat::cuda_built() ? "built" : "not built");
  std::printf("  CUDA devices  : %d\n", remat::cuda_device_count());
  for (int d = 0; d < remat::cuda_device_count(); ++d) {
    const remat::DeviceInfo i = remat::device_info(remat::cuda_device(d));
    std::printf("    cuda:%d      : %s, sm_%d%d, %d SMs at %.0f MHz, %.1f GiB\n", d, i.name.c_str(), i.major, i.minor,
                i.multiprocessors, i.clock_khz / 1e3, double(i.memory_bytes) / double(1ull << 30));
  }
  const auto world = remat::world_group();
  const std::string how = world->size() > 1 ? "MPI, this is rank " + std::to_string(world->rank()) : "no launcher";
  std::printf("  processes     : %d (%s)\n", world->size(), how.c_str());
  std::printf("  CPU threads   : %d\n", remat::num_threads());
  auto& alloc = remat::allocator_for(remat::kCPU);
  remat::Tensor probe = remat::zeros({256, 256});
  std::printf("  CPU allocator : %s\n", alloc.describe().c_str());
  return 0;
}

struct Command {
  const char* help;
  std::function<int(const Args&)> run;
};

const std::map<std::string, Command>& commands() {
  static const std::map<std::string, Command> c = {
      {"info", {"show the build (CUDA or not), devices, threads and allocator", cmd_info}},
      {"bench-ops", {"GFLOP/s and GB/s of the CPU kernels at transformer shapes", remat::tools::run_bench_ops}},
      {"train", {"train a model, showing progress", remat::tools::run_train}},
      {"dump", {"one deterministic forward/backward written to safetensors", remat::tools::run_dump}},
      {"mem", {"memory timeline of one training step as JSON + HTML", remat::tools::run_mem}},
      {"bench", {"memory and speed of recompute plans, each repeat in a fresh process", remat::tools::run_bench}},
      {"plan", {"the recompute plan for a memory budget (--recompute auto), with predictions", remat::tools::run_plan}},
      {"tokenize", {"text to token shards for train --data, ids as JSON, or ids back to text", remat::tools::run_tokenize}},
      {"eval", {"validation loss and perplexity of a training state", remat::tools::run_eval}},
      {"generate", {"sample text from a training state or a Hugging Face model (KV cache)", remat::tools::run_generate}},
      {"export", {"write a training state as a Hugging Face model folder", remat::tools::run_export}},
      {"ops", {"the op table: every op, its inputs, saves, kernels and flags", remat::tools::run_ops}},
      {"bench-worker", {"(internal) one measurement process of bench", remat::tools::run_bench_worker}},
      {"bench-pipeline-worker", {"(internal) one pipeline job of bench --pp", remat::tools::run_bench_pipeline_worker}},
  };
  return c;
}

void print_help() {
  std::printf("commands:\n");
  for (const auto& [name, c] : commands()) std::printf("  %-12s %s\n", name.c_str(), c.help);
  std::printf("run `remat COMMAND --help` (or `remat help COMMAND`) for a command's flags\n");
}

}  // namespace

int main(int argc, char** argv) {
  // Under mpirun a failed or stuck peer ends this rank, naming the collective.
  remat::tools::install_comm_failure_handling();
  const bool help = argc >= 2 && (!std::strcmp(argv[1], "help") || !std::strcmp(argv[1], "--help") ||
                                  !std::strcmp(argv[1], "-h"));
  if (argc < 2 || (help && argc == 2)) {
    print_help();
    return 0;
  }
  // `remat help COMMAND` is `remat COMMAND --help`.
  const std::string name = help ? argv[2] : argv[1];
  const Args args = help ? Args{"--help"} : Args(argv + 2, argv + argc);
  auto it = commands().find(name);
  if (it == commands().end()) {
    std::fprintf(stderr, "remat: unknown command '%s'\n", name.c_str());
    print_help();
    return 2;
  }
  try {
    return it->second.run(args);
  } catch (const remat::tools::HelpRequested& h) {
    std::fputs(h.what(), stdout);
    return 0;
  } catch (const remat::Error& e) {
    std::fprintf(stderr, "remat %s: %s\n", name.c_str(), e.what());
    std::fflush(stderr);
    remat::abort_job(1);  // under mpirun: take the other ranks down too
    return 1;
  }
}
