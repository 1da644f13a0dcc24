// Pieces of the autograd engine shared between its files: autograd.cc (grad
// mode, nodes, recording), saved_tensor.cc (hooks, regions, SavedTensor),
// saved_bytes.cc (the saved-bytes registry), backward.cc (the executor) and
// gradient_kernels.cc. Internal to engine/.
#pragma once

#include <cstdint>
#include <string>

#include "engine/autograd.h"

namespace remat::detail {

// Counts one backward function run on this thread (autograd_counters()).
void count_node_run();
// True if `node` is a leaf's gradient sink (it writes .grad; grad() never runs it).
bool is_accumulate_grad(const Node* node);

// The saved-bytes registry (saved_bytes.cc). `sign` +1 holds, -1 releases;
// count_delta adjusts the count of SavedTensors holding data. The tensor form
// counts t's storage once however many holders it has; the raw form counts
// `bytes` under `key` (a hook's own holding).
void saved_bytes_tensor(const Tensor& t, const std::string& holder, std::int64_t region, int sign, int count_delta);
void saved_bytes_raw(const void* key, std::int64_t bytes, const std::string& holder, std::int64_t region, int sign,
                     int count_delta);

}  // namespace remat::detail
