#include "train/comm_estimate.h"

#include <algorithm>

#include "parallel/simulated_group.h"

namespace remat {

bool spans_nodes(const ProcessGroup& g, int devices_per_node) {
  const std::vector<int> ranks = simulated_world_ranks(g);
  if (ranks.empty()) return false;
  const auto [lo, hi] = std::minmax_element(ranks.begin(), ranks.end());
  return *lo / devices_per_node != *hi / devices_per_node;
}

double comm_seconds(const ProcessGroup& g, const CommCounters& counted, const DeviceModel& model) {
  const double n = g.size();
  if (n <= 1) return 0;
  const double bw = spans_nodes(g, model.devices_per_node) ? model.network_bw : model.link_bw;
  REMAT_CHECK(bw > 0, Error, "device model '", model.name, "' has no link bandwidth for the communication estimate");
  double seconds = 0;
  for (std::size_t k = 0; k < kCollectiveKinds; ++k) {
    double bytes = 0, calls = 0;
    for (std::size_t p = 0; p < 3; ++p) {
      bytes += double(counted.bytes[k][p]);
      calls += double(counted.calls[k][p]);
    }
    double factor = 1;
    switch (CollectiveKind(k)) {
      case CollectiveKind::all_reduce: factor = 2 * (n - 1) / n; break;
      case CollectiveKind::all_gather: factor = n - 1; break;
      case CollectiveKind::reduce_scatter:
      case CollectiveKind::all_to_all: factor = (n - 1) / n; break;
      case CollectiveKind::broadcast:
      case CollectiveKind::send: factor = 1; break;
      case CollectiveKind::recv: factor = 0; break;
      case CollectiveKind::barrier: factor = 0; break;
    }
    seconds += factor * bytes / bw + calls * model.comm_seconds;
  }
  return seconds;
}

}  // namespace remat
