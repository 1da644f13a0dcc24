// A leased pool for the MoE dispatch payload: the permuted rows that must
// live from the forward to their backward consumer. A lease returns a tensor
// over a pooled block; when the last view of it dies the block goes back to
// the pool (not to the allocator), so every step reuses the same blocks.
// Leased bytes are reported to the saved-bytes registry as
// "moe_dispatch_pool". Inside a checkpoint region the layer uses ordinary
// per-call scratch instead: there no backward reads the payload, and no pool
// block is held for it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/tensor.h"

namespace remat {

class DispatchBufferPool {
 public:
  // The pool of `device` (one per device, created on first use).
  static DispatchBufferPool& for_device(Device device);

  // A contiguous tensor of `sizes` and `dtype` over a pooled block.
  Tensor lease(const Shape& sizes, DType dtype);

  struct Stats {
    std::int64_t leases = 0;
    std::int64_t reuses = 0;        // leases served by a returned block
    std::int64_t leased_bytes = 0;  // held by live leases now
    std::int64_t pooled_bytes = 0;  // idle in the pool now
  };
  Stats stats() const;
  // Returns idle blocks to the allocator.
  void trim();

  explicit DispatchBufferPool(Device device) : device_(device) {}

 private:
  void give_back(std::unique_ptr<Storage> block);

  Device device_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Storage>> idle_;
  Stats stats_;
};

}  // namespace remat
