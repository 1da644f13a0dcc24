#include "moe/buffer_pool.h"

#include <map>

#include "engine/autograd.h"
#include "engine/immortal.h"

namespace remat {

DispatchBufferPool& DispatchBufferPool::for_device(Device device) {
  struct Pools {
    std::mutex mu;
    std::map<std::pair<int, int>, std::unique_ptr<DispatchBufferPool>> by_device;
  };
  static detail::Immortal<Pools> pools;
  std::lock_guard<std::mutex> lock(pools.get().mu);
  auto& slot = pools.get().by_device[{int(device.type), device.index}];
  if (!slot) slot = std::make_unique<DispatchBufferPool>(device);
  return *slot;
}

Tensor DispatchBufferPool::lease(const Shape& sizes, DType dtype) {
  const std::size_t bytes = std::size_t(shape_numel(sizes)) * element_size(dtype);
  std::unique_ptr<Storage> block;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.leases++;
    // Best fit among idle blocks.
    std::size_t best = idle_.size();
    for (std::size_t i = 0; i < idle_.size(); ++i)
      if (idle_[i]->nbytes() >= bytes && (best == idle_.size() || idle_[i]->nbytes() < idle_[best]->nbytes())) best = i;
    if (best < idle_.size()) {
      block = std::move(idle_[best]);
      idle_.erase(idle_.begin() + std::ptrdiff_t(best));
      stats_.reuses++;
      stats_.pooled_bytes -= std::int64_t(block->nbytes());
    }
  }
  if (!block) {
    CategoryScope cat(MemoryCategory::communication);
    block = std::make_unique<Storage>(bytes, device_);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.leased_bytes += std::int64_t(block->nbytes());
  }
  // The block comes back to this pool when the last view of it dies.
  Storage* raw = block.release();
  std::shared_ptr<Storage> shared(raw, [this](Storage* s) { give_back(std::unique_ptr<Storage>(s)); });
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(shared);
  impl->sizes = sizes;
  impl->strides = contiguous_strides(sizes);
  impl->dtype = dtype;
  impl->version = std::make_shared<VersionCounter>();
  return Tensor(std::move(impl));
}

void DispatchBufferPool::give_back(std::unique_ptr<Storage> block) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.leased_bytes -= std::int64_t(block->nbytes());
  stats_.pooled_bytes += std::int64_t(block->nbytes());
  idle_.push_back(std::move(block));
}

DispatchBufferPool::Stats DispatchBufferPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void DispatchBufferPool::trim() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.pooled_bytes = 0;
  idle_.clear();
}

}  // namespace remat
