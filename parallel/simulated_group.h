// One rank of a job that is not running (docs/META.md#one-rank-of-a-job-that-is-not-running):
// a process group whose collectives, sends and receives move nothing and
// have only their shape-only effects, so that rank R's step of a job of N
// ranks runs on the meta device in one process and allocates what rank R
// would. Counters count what the real group would send.
//
// The rule for what the other ranks hold: every rank is like this one (the
// steps are the same program on same-shaped shards; MoE routes on meta are
// balanced, so every rank sends every other the same rows). Hence:
//   all_gather      N copies of this rank's tensor along dim 0;
//   all_reduce      sum: N times this rank's values; avg and max: its own;
//   reduce_scatter  slice r of the sum: N times this rank's slice r;
//   all_to_all      from each rank, the rows this rank sends itself
//                   (recv_rows[j] = send_rows[rank], unless known);
//   broadcast       unchanged; barrier: nothing; sends: counted.
// On meta tensors these are shapes only (outputs allocated exactly as the
// MPI group allocates them, on the input's device); on CPU tensors (host
// bookkeeping: counts, fingerprints, loss values) the rule gives values.
// A receive into a CPU tensor has no values to give and is an Error naming
// it; tensors on other devices are refused (DeviceError).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/process_group.h"

namespace remat {

// Rank `rank` of a simulated job of `size` ranks (Error naming both unless
// 0 <= rank < size).
std::shared_ptr<ProcessGroup> simulated_world(int size, int rank);

// The world ranks of a group's members in group order when it is a
// simulated group (from simulated_world and its split_by), else empty.
std::vector<int> simulated_world_ranks(const ProcessGroup& g);

}  // namespace remat
