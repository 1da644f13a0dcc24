// The link model of the time estimate (checkpoint/time_estimate.h): the
// seconds one rank spends in the collectives, sends and receives a group
// counted, for a named device model. An estimate, labelled so wherever it
// is printed; nothing overlaps with compute (an upper bound).
//
// Per call of a group of n ranks, B the bytes counted (ProcessGroup::count:
// what this rank puts in), bw the link between them (devices on one node:
// link_bw; a group whose ranks span nodes: network_bw), ring algorithms:
//   all_reduce      2 (n - 1) / n * B / bw
//   all_gather      (n - 1) * B / bw          (B is this rank's piece)
//   reduce_scatter  (n - 1) / n * B / bw      (B is the whole input)
//   all_to_all      (n - 1) / n * B / bw      (balanced: 1/n stays here)
//   broadcast, send B / bw; recv 0 (the sender's link carries it)
// plus comm_seconds per call. A group knows its ranks' nodes only when it is
// simulated (parallel/simulated_group.h); any other is taken as one node.
#pragma once

#include <memory>
#include <vector>

#include "checkpoint/time_estimate.h"
#include "parallel/process_group.h"

namespace remat {

// Seconds for the calls in `counted` (a difference of g's counters) on g.
double comm_seconds(const ProcessGroup& g, const CommCounters& counted, const DeviceModel& model);

// True when g's ranks lie on more than one node of `devices_per_node`.
bool spans_nodes(const ProcessGroup& g, int devices_per_node);

}  // namespace remat
