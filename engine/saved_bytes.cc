// The saved-bytes registry: the bytes held for backward right now, by saved
// tensors and by the checkpoint engine, deduplicated by storage, with the
// peak and the attribution by op and by region (engine/autograd.h).
#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "engine/autograd.h"
#include "engine/autograd_internal.h"
#include "engine/immortal.h"

namespace remat {

// ---------------------------------------------------------------------------
// The saved-bytes registry

namespace {
struct SavedRegistry {
  struct Holding {
    std::int64_t refs = 0;
    std::int64_t bytes = 0;
    bool activation = true;
  };
  std::mutex mu;
  std::int64_t live = 0;
  std::int64_t peak = 0;
  std::int64_t act_live = 0;
  std::int64_t act_peak = 0;
  std::int64_t count = 0;
  std::unordered_map<const void*, Holding> storages;  // storage (or raw key) -> holders
  std::map<std::string, std::int64_t> by_op;
  std::map<std::int64_t, std::int64_t> by_region;

  // key: what is held (a storage, deduplicated); bytes: its full size;
  // own_bytes: the holder's share for the by-op/by-region attribution.
  void hold(const void* key, std::int64_t bytes, const std::string& op, std::int64_t region,
            std::int64_t own_bytes, int sign, int count_delta, bool activation = true) {
    std::lock_guard<std::mutex> lock(mu);
    Holding& h = storages[key];
    if (sign > 0) {
      if (h.refs++ == 0) {
        h.bytes = bytes;
        h.activation = activation;
        live += bytes;
        if (activation) act_live += bytes;
      }
    } else {
      if (--h.refs == 0) {
        live -= h.bytes;
        if (h.activation) act_live -= h.bytes;
        storages.erase(key);
      }
    }
    peak = std::max(peak, live);
    act_peak = std::max(act_peak, act_live);
    count += count_delta;
    auto& o = by_op[op];
    o += sign * own_bytes;
    if (o == 0) by_op.erase(op);
    auto& r = by_region[region];
    r += sign * own_bytes;
    if (r == 0) by_region.erase(region);
  }

  void tensor(const Tensor& t, const std::string& op, std::int64_t region, int sign, int count_delta) {
    if (!t.defined() || !t.impl().storage) return;
    const Storage* st = t.impl().storage.get();
    const MemoryCategory c = st->category();
    const bool activation = c != MemoryCategory::parameter && c != MemoryCategory::gradient &&
                            c != MemoryCategory::optimizer;
    hold(st, std::int64_t(st->nbytes()), op, region, std::int64_t(t.nbytes()), sign, count_delta, activation);
  }
};
SavedRegistry& saved_registry() {
  static detail::Immortal<SavedRegistry> r;
  return r.get();
}
}  // namespace

SavedBytesReport saved_bytes_report() {
  auto& r = saved_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  SavedBytesReport rep;
  rep.live_bytes = r.live;
  rep.peak_bytes = r.peak;
  rep.activation_live_bytes = r.act_live;
  rep.activation_peak_bytes = r.act_peak;
  rep.live_count = r.count;
  rep.bytes_by_op = r.by_op;
  rep.bytes_by_region = r.by_region;
  return rep;
}

void saved_bytes_hold(const Tensor& t, const std::string& holder, std::int64_t region) {
  saved_registry().tensor(t, holder, region, +1, 0);
}

void saved_bytes_release(const Tensor& t, const std::string& holder, std::int64_t region) {
  saved_registry().tensor(t, holder, region, -1, 0);
}

std::int64_t saved_bytes_live() {
  auto& r = saved_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.live;
}

void reset_saved_bytes_peak() {
  auto& r = saved_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.peak = r.live;
  r.act_peak = r.act_live;
}

void detail::saved_bytes_tensor(const Tensor& t, const std::string& holder, std::int64_t region, int sign,
                                int count_delta) {
  saved_registry().tensor(t, holder, region, sign, count_delta);
}

void detail::saved_bytes_raw(const void* key, std::int64_t bytes, const std::string& holder, std::int64_t region,
                             int sign, int count_delta) {
  saved_registry().hold(key, bytes, holder, region, bytes, sign, count_delta);
}

}  // namespace remat
