// ./remat bench --estimate: activation bytes predicted from what the ops
// save in a traced step, next to a measured step.
#pragma once

#include "tools/bench_options.h"

namespace remat::tools {

// Per plan: the activation bytes predicted from a traced step at batch 1
// (what the ops save, plus backward's working set), scaled to the batch
// (both grow linearly with it), next to the allocator's measurement of a
// real step at the full batch in a bench worker; a table, and --json.
// Returns the exit status.
int run_estimate(const BenchOptions& o);

}  // namespace remat::tools
