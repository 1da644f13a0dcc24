#include "engine/allocator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <unordered_set>

#include "engine/device_backend.h"
#include "engine/error.h"
#include "engine/immortal.h"
#include "engine/memory_poison.h"

namespace remat {

// ---------------------------------------------------------------------------
// Categories and tags (thread-local scopes)

namespace {
thread_local MemoryCategory tls_category = MemoryCategory::other;
thread_local const char* tls_tag = "";
thread_local MemoryPressureHandler* tls_pressure = nullptr;
thread_local bool tls_relieving = false;  // a handler is running on this thread

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::size_t round_size(std::size_t bytes) {
  const std::size_t r = CachingAllocator::kRoundBytes;
  return bytes < r ? r : (bytes + r - 1) / r * r;
}

// Free bytes of a host segment are poisoned for ASan (engine/memory_poison.h):
// a whole segment when reserved, a block when freed into the cache. Only host
// memory: a CUDA allocator's pointers are device addresses.
void poison_cached(const MemoryBackend& backend, const char* ptr, std::size_t bytes) {
  if (backend.device().is_cpu()) detail::poison_host_memory(ptr, bytes);
}

// Makes bytes addressable again: a block handed out, or a segment before it
// goes back to the backend.
void unpoison_cached(const MemoryBackend& backend, const char* ptr, std::size_t bytes) {
  if (backend.device().is_cpu()) detail::unpoison_host_memory(ptr, bytes);
}

std::size_t segment_size_for(std::size_t size) {
  if (size <= CachingAllocator::kSmallRequest) return CachingAllocator::kSmallSegment;
  if (size < CachingAllocator::kMidRequest) return CachingAllocator::kMidSegment;
  const std::size_t r = CachingAllocator::kLargeRound;
  return (size + r - 1) / r * r;
}
}  // namespace

const char* category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::parameter: return "parameter";
    case MemoryCategory::gradient: return "gradient";
    case MemoryCategory::optimizer: return "optimizer";
    case MemoryCategory::activation: return "activation";
    case MemoryCategory::recompute: return "recompute";
    case MemoryCategory::workspace: return "workspace";
    case MemoryCategory::communication: return "communication";
    case MemoryCategory::other: return "other";
    case MemoryCategory::loss: return "loss";
  }
  return "?";
}

const char* event_kind_name(MemoryEvent::Kind k) {
  switch (k) {
    case MemoryEvent::Kind::alloc: return "alloc";
    case MemoryEvent::Kind::free: return "free";
    case MemoryEvent::Kind::segment_alloc: return "segment_alloc";
    case MemoryEvent::Kind::segment_free: return "segment_free";
    case MemoryEvent::Kind::marker: return "marker";
  }
  return "?";
}

MemoryCategory current_category() { return tls_category; }
CategoryScope::CategoryScope(MemoryCategory c) : previous_(tls_category) { tls_category = c; }
CategoryScope::~CategoryScope() { tls_category = previous_; }

const char* current_tag() { return tls_tag; }

MemoryPressureScope::MemoryPressureScope(MemoryPressureHandler& handler) : previous_(tls_pressure) {
  tls_pressure = &handler;
}
MemoryPressureScope::~MemoryPressureScope() { tls_pressure = previous_; }
TagScope::TagScope(const char* tag) : previous_(tls_tag) { tls_tag = tag ? tag : ""; }
TagScope::~TagScope() { tls_tag = previous_; }

std::string format_bytes(std::int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (std::abs(v) >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

// ---------------------------------------------------------------------------
// DataPtr

DataPtr::DataPtr(DataPtr&& other) noexcept : ptr_(other.ptr_), owner_(other.owner_) {
  other.ptr_ = nullptr;
  other.owner_ = nullptr;
}

DataPtr& DataPtr::operator=(DataPtr&& other) noexcept {
  if (this != &other) {
    reset();
    ptr_ = other.ptr_;
    owner_ = other.owner_;
    other.ptr_ = nullptr;
    other.owner_ = nullptr;
  }
  return *this;
}

DataPtr::~DataPtr() { reset(); }

void DataPtr::reset() {
  if (ptr_ && owner_) owner_->free(ptr_);
  ptr_ = nullptr;
  owner_ = nullptr;
}

// ---------------------------------------------------------------------------
// Blocks and pools

// A contiguous range inside one segment. Blocks of a segment form a doubly
// linked list in address order; free neighbours are merged on free.
struct CachingAllocator::Block {
  char* ptr = nullptr;
  std::size_t size = 0;
  std::size_t requested = 0;
  StreamId stream = 0;
  // Which segment, in the order segments were reserved: ties between cached
  // blocks of one size go to the older segment, then the lower address in
  // it, so the choice never depends on where the device put a segment (a
  // meta run, whose addresses are made up, picks as the CPU does).
  std::uint64_t segment = 0;
  bool small = false;
  bool allocated = false;
  MemoryCategory category = MemoryCategory::other;
  const char* tag = "";
  Block* prev = nullptr;
  Block* next = nullptr;
  std::vector<StreamId> stream_uses;  // other streams that used this block
};

bool CachingAllocator::BlockLess::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return a->stream < b->stream;
  if (a->size != b->size) return a->size < b->size;
  if (a->segment != b->segment) return a->segment < b->segment;
  return a->ptr < b->ptr;
}

CachingAllocator::Block* CachingAllocator::new_block() {
  if (!spare_blocks_.empty()) {
    Block* b = spare_blocks_.back();
    spare_blocks_.pop_back();
    *b = Block{};
    return b;
  }
  block_storage_.emplace_back();
  return &block_storage_.back();
}

void CachingAllocator::recycle_block(Block* b) { spare_blocks_.push_back(b); }

CachingAllocator::CachingAllocator(std::unique_ptr<MemoryBackend> backend)
    : backend_(std::move(backend)) {}

CachingAllocator::~CachingAllocator() {
  // Return every segment; blocks still allocated are leaked by their owner's
  // mistake, but their memory is released with the segment.
  std::lock_guard<std::mutex> lock(mu_);
  std::unordered_set<const Block*> spare(spare_blocks_.begin(), spare_blocks_.end());
  for (Block& b : block_storage_) {
    if (spare.count(&b) || !b.ptr || b.prev != nullptr) continue;
    std::size_t segment_bytes = 0;
    for (const Block* s = &b; s; s = s->next) segment_bytes += s->size;
    unpoison_cached(*backend_, b.ptr, segment_bytes);
    backend_->raw_free(b.ptr);
  }
}

Device CachingAllocator::device() const { return backend_->device(); }

CachingAllocator::Block* CachingAllocator::find_free_block(Pool& pool, std::size_t size,
                                                           StreamId stream) {
  Block key;
  key.stream = stream;
  key.size = size;
  key.segment = 0;
  key.ptr = nullptr;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  pool.erase(it);
  return b;
}

CachingAllocator::Block* CachingAllocator::reserve_segment(std::size_t segment_size,
                                                           StreamId stream, bool small) {
  if (limit_ > 0 && stats_.reserved_bytes + std::int64_t(segment_size) > limit_) return nullptr;
  void* p = backend_->raw_alloc(segment_size);
  if (!p) return nullptr;
  poison_cached(*backend_, static_cast<const char*>(p), segment_size);  // all of it cached
  Block* b = new_block();
  b->ptr = static_cast<char*>(p);
  b->size = segment_size;
  b->stream = stream;
  b->segment = ++segments_reserved_;
  b->small = small;
  stats_.reserved_bytes += std::int64_t(segment_size);
  stats_.reserved_peak = std::max(stats_.reserved_peak, stats_.reserved_bytes);
  stats_.num_device_allocs++;
  segments_++;
  record(MemoryEvent::Kind::segment_alloc, reinterpret_cast<std::uintptr_t>(p),
         std::int64_t(segment_size), current_category(), current_tag());
  return b;
}

bool CachingAllocator::release_cached_segments() {
  bool released = false;
  for (Pool* pool : {&small_pool_, &large_pool_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* b = *it;
      if (b->prev == nullptr && b->next == nullptr) {
        unpoison_cached(*backend_, b->ptr, b->size);
        backend_->raw_free(b->ptr);
        stats_.reserved_bytes -= std::int64_t(b->size);
        stats_.num_device_frees++;
        segments_--;
        record(MemoryEvent::Kind::segment_free, reinterpret_cast<std::uintptr_t>(b->ptr),
               std::int64_t(b->size), MemoryCategory::other, "");
        it = pool->erase(it);
        recycle_block(b);
        released = true;
      } else {
        ++it;
      }
    }
  }
  return released;
}

std::size_t CachingAllocator::charge_locked(std::size_t size, StreamId stream) const {
  const bool small = size <= kSmallRequest;
  const Pool& pool = small ? small_pool_ : large_pool_;
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = pool.lower_bound(&key);
  const std::size_t block = it != pool.end() && (*it)->stream == stream ? (*it)->size : segment_size_for(size);
  const std::size_t remaining = block - size;
  return (small && remaining >= kRoundBytes) || (!small && remaining > kMinLargeSplit) ? size : block;
}

void CachingAllocator::relieve_pressure(std::size_t size, StreamId stream) {
  MemoryPressureHandler* h = tls_pressure;
  if (!h || tls_relieving || h->budget() <= 0 || h->device() != device()) return;
  for (;;) {
    std::int64_t allocated = 0, charge = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      process_pending();
      allocated = stats_.allocated_bytes;
      charge = std::int64_t(charge_locked(size, stream));
    }
    if (allocated + charge <= h->budget()) return;
    tls_relieving = true;
    bool freed = false;
    try {
      freed = h->relieve(*this, allocated, charge);
    } catch (...) {
      tls_relieving = false;
      throw;
    }
    tls_relieving = false;
    if (!freed) return;
  }
}

std::int64_t CachingAllocator::free_run_if_freed(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocated_.find(const_cast<void*>(ptr));
  if (it == allocated_.end() || !it->second->stream_uses.empty()) return 0;
  const Block* b = it->second;
  const Pool& pool = b->small ? small_pool_ : large_pool_;
  std::size_t run = b->size;
  if (const Block* p = b->prev; p && !p->allocated && pool.count(const_cast<Block*>(p))) run += p->size;
  if (const Block* n = b->next; n && !n->allocated && pool.count(const_cast<Block*>(n))) run += n->size;
  return std::int64_t(run);
}

DataPtr CachingAllocator::allocate(std::size_t bytes, StreamId stream) {
  if (bytes == 0) return DataPtr();
  if (tls_pressure) relieve_pressure(round_size(bytes), stream);
  std::lock_guard<std::mutex> lock(mu_);
  process_pending();
  const std::size_t size = round_size(bytes);
  const bool small = size <= kSmallRequest;
  Pool& pool = small ? small_pool_ : large_pool_;

  Block* block = find_free_block(pool, size, stream);
  if (block) {
    stats_.cache_hits++;
  } else {
    const std::size_t seg = segment_size_for(size);
    block = reserve_segment(seg, stream, small);
    if (!block) {
      stats_.num_alloc_retries++;
      release_cached_segments();
      block = reserve_segment(seg, stream, small);
    }
    if (!block) {
      stats_.num_ooms++;
      std::ostringstream os;
      os << "out of memory on " << backend_->device() << ": tried to allocate "
         << format_bytes(std::int64_t(size)) << " (requested " << bytes << " bytes, category "
         << category_name(current_category());
      if (*current_tag()) os << ", op '" << current_tag() << "'";
      os << ", needs a new segment of " << format_bytes(std::int64_t(seg)) << "); "
         << describe_locked();
      throw OutOfMemoryError(os.str());
    }
  }

  // Split off the remainder when it is worth keeping as its own block.
  const std::size_t remaining = block->size - size;
  if ((small && remaining >= kRoundBytes) || (!small && remaining > kMinLargeSplit)) {
    Block* rest = new_block();
    rest->ptr = block->ptr + size;
    rest->size = remaining;
    rest->stream = block->stream;
    rest->segment = block->segment;
    rest->small = block->small;
    rest->prev = block;
    rest->next = block->next;
    if (rest->next) rest->next->prev = rest;
    block->next = rest;
    block->size = size;
    pool.insert(rest);
  }

  // The rounded request; an unsplit tail beyond it stays poisoned.
  unpoison_cached(*backend_, block->ptr, size);
  block->allocated = true;
  block->requested = bytes;
  block->category = current_category();
  block->tag = current_tag();
  allocated_[block->ptr] = block;

  const auto bsize = std::int64_t(block->size);
  stats_.num_allocs++;
  stats_.allocated_bytes += bsize;
  stats_.active_bytes += bsize;
  stats_.requested_bytes += std::int64_t(bytes);
  stats_.category_bytes[std::size_t(block->category)] += bsize;
  update_peaks();
  record(MemoryEvent::Kind::alloc, reinterpret_cast<std::uintptr_t>(block->ptr), bsize,
         block->category, block->tag);
  return DataPtr(block->ptr, this);
}

void CachingAllocator::update_peaks() {
  auto& s = stats_;
  if (s.allocated_bytes > s.allocated_peak) {
    s.allocated_peak = s.allocated_bytes;
    s.category_bytes_at_peak = s.category_bytes;
  }
  s.active_peak = std::max(s.active_peak, s.active_bytes);
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i)
    s.category_peak[i] = std::max(s.category_peak[i], s.category_bytes[i]);
}

void CachingAllocator::free(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocated_.find(ptr);
  if (it == allocated_.end()) return;  // not ours: nothing sensible to do in a destructor
  Block* block = it->second;
  allocated_.erase(it);

  const auto bsize = std::int64_t(block->size);
  stats_.num_frees++;
  stats_.allocated_bytes -= bsize;
  stats_.requested_bytes -= std::int64_t(block->requested);
  stats_.category_bytes[std::size_t(block->category)] -= bsize;
  record(MemoryEvent::Kind::free, reinterpret_cast<std::uintptr_t>(block->ptr), bsize,
         block->category, block->tag);

  if (!block->stream_uses.empty()) {
    // Other streams may still read this block: wait for their work first.
    PendingFree pf{block, {}};
    for (StreamId s : block->stream_uses) pf.events.push_back(backend_->record_event(s));
    block->stream_uses.clear();
    pending_.push_back(std::move(pf));
    return;
  }
  free_block(block);
}

void CachingAllocator::free_block(Block* block) {
  stats_.active_bytes -= std::int64_t(block->size);
  poison_cached(*backend_, block->ptr, block->size);  // before merging: its neighbours already are
  block->allocated = false;
  block->requested = 0;
  Pool& pool = block->small ? small_pool_ : large_pool_;
  // Coalesce with free neighbours of the same segment.
  if (Block* p = block->prev; p && !p->allocated && pool.count(p)) {
    pool.erase(p);
    p->size += block->size;
    p->next = block->next;
    if (p->next) p->next->prev = p;
    recycle_block(block);
    block = p;
  }
  if (Block* n = block->next; n && !n->allocated && pool.count(n)) {
    pool.erase(n);
    block->size += n->size;
    block->next = n->next;
    if (block->next) block->next->prev = block;
    recycle_block(n);
  }
  pool.insert(block);
}

void CachingAllocator::process_pending() {
  for (auto it = pending_.begin(); it != pending_.end();) {
    bool done = std::all_of(it->events.begin(), it->events.end(),
                            [&](EventId e) { return backend_->event_done(e); });
    if (done) {
      for (EventId e : it->events) backend_->destroy_event(e);
      free_block(it->block);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
}

void CachingAllocator::record_stream(void* ptr, StreamId stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocated_.find(ptr);
  REMAT_CHECK(it != allocated_.end(), Error,
              "record_stream: pointer is not a live allocation of the ", backend_->device(),
              " allocator");
  Block* b = it->second;
  if (stream == b->stream) return;
  if (std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) == b->stream_uses.end())
    b->stream_uses.push_back(stream);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  process_pending();
  release_cached_segments();
}

void CachingAllocator::set_memory_limit(std::int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  limit_ = bytes < 0 ? 0 : bytes;
}

std::int64_t CachingAllocator::memory_limit() const {
  std::lock_guard<std::mutex> lock(mu_);
  return limit_;
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.allocated_peak = stats_.allocated_bytes;
  stats_.reserved_peak = stats_.reserved_bytes;
  stats_.active_peak = stats_.active_bytes;
  stats_.category_bytes_at_peak = stats_.category_bytes;
  stats_.category_peak = stats_.category_bytes;
}

void CachingAllocator::reset_counters() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.num_allocs = stats_.num_frees = 0;
    stats_.num_device_allocs = stats_.num_device_frees = 0;
    stats_.cache_hits = stats_.num_alloc_retries = stats_.num_ooms = 0;
  }
  reset_peak();
}

void CachingAllocator::enable_history(std::size_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  history_capacity_ = capacity;
  history_.clear();
  history_.reserve(std::min<std::size_t>(capacity, 1 << 16));
  history_seq_ = 0;
  history_t0_ns_ = now_ns();
}

void CachingAllocator::record(MemoryEvent::Kind kind, std::uintptr_t ptr, std::int64_t size,
                              MemoryCategory cat, const std::string& tag) {
  if (history_capacity_ == 0) return;
  MemoryEvent e;
  e.seq = history_seq_++;
  e.time_ns = now_ns() - history_t0_ns_;
  e.kind = kind;
  e.ptr = ptr;
  e.size = size;
  e.category = cat;
  e.tag = tag;
  e.allocated_after = stats_.allocated_bytes;
  e.reserved_after = stats_.reserved_bytes;
  if (history_.size() < history_capacity_)
    history_.push_back(std::move(e));
  else
    history_[e.seq % history_capacity_] = std::move(e);
}

std::vector<MemoryEvent> CachingAllocator::history() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (history_.size() < history_capacity_ || history_capacity_ == 0) return history_;
  // Full ring: the oldest entry sits right after the newest one.
  std::vector<MemoryEvent> out;
  out.reserve(history_.size());
  const std::size_t start = history_seq_ % history_capacity_;
  for (std::size_t i = 0; i < history_.size(); ++i)
    out.push_back(history_[(start + i) % history_capacity_]);
  return out;
}

void CachingAllocator::mark(const std::string& label) {
  std::lock_guard<std::mutex> lock(mu_);
  record(MemoryEvent::Kind::marker, 0, 0, MemoryCategory::other, label);
}

std::string CachingAllocator::describe_locked() const {
  std::int64_t cached = 0, largest = 0;
  for (const Pool* pool : {&small_pool_, &large_pool_}) {
    for (const Block* b : *pool) {
      cached += std::int64_t(b->size);
      largest = std::max(largest, std::int64_t(b->size));
    }
  }
  std::ostringstream os;
  os << "allocator state: allocated " << format_bytes(stats_.allocated_bytes) << " in "
     << allocated_.size() << " blocks, reserved " << format_bytes(stats_.reserved_bytes) << " in "
     << segments_ << " segments, cached free " << format_bytes(cached) << " (largest free block "
     << format_bytes(largest) << "), limit "
     << (limit_ > 0 ? format_bytes(limit_) : std::string("none")) << ", peak allocated "
     << format_bytes(stats_.allocated_peak);
  return os.str();
}

std::string CachingAllocator::describe() const {
  std::lock_guard<std::mutex> lock(mu_);
  return describe_locked();
}

// ---------------------------------------------------------------------------
// The CPU back end and the per-device registry

namespace {

class CpuMemoryBackend final : public MemoryBackend {
 public:
  Device device() const override { return kCPU; }
  void* raw_alloc(std::size_t bytes) override {
    // Segments are multiples of 512 bytes; 64-byte alignment suits AVX-512.
    return std::aligned_alloc(64, bytes);
  }
  void raw_free(void* ptr) override { std::free(ptr); }
};

// The meta device's memory: addresses without memory. Each segment gets a
// fresh, 512-aligned range of a made-up address space that nothing reads or
// writes (a meta tensor's data access throws first), so a 70B model's
// parameters cost no RAM; segments are never handed out twice.
class MetaMemoryBackend final : public MemoryBackend {
 public:
  Device device() const override { return kMeta; }
  void* raw_alloc(std::size_t bytes) override {
    const std::uintptr_t p = next_;
    next_ += (bytes + kAlign - 1) / kAlign * kAlign + kAlign;  // a gap: no two segments touch
    return reinterpret_cast<void*>(p);
  }
  void raw_free(void*) override {}

 private:
  static constexpr std::uintptr_t kAlign = 512;
  std::uintptr_t next_ = std::uintptr_t(1) << 44;  // called under the allocator's lock
};

struct Registry {
  std::mutex mu;
  std::unique_ptr<CachingAllocator> cpu;
  std::unique_ptr<CachingAllocator> meta;
  std::vector<std::unique_ptr<CachingAllocator>> cuda;
};

Registry& registry() {
  static detail::Immortal<Registry> r;
  return r.get();
}

}  // namespace

std::unique_ptr<MemoryBackend> make_cpu_memory_backend() {
  return std::make_unique<CpuMemoryBackend>();
}

CachingAllocator& allocator_for(Device device) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (device.is_cpu()) {
    if (!r.cpu) r.cpu = std::make_unique<CachingAllocator>(make_cpu_memory_backend());
    return *r.cpu;
  }
  if (device.is_meta()) {
    if (!r.meta) r.meta = std::make_unique<CachingAllocator>(std::make_unique<MetaMemoryBackend>());
    return *r.meta;
  }
  DeviceBackend& backend = detail::cuda_backend("allocating memory", device);
  const int n = backend.device_count();
  REMAT_CHECK(device.index >= 0 && device.index < n, DeviceError, "device ", device,
              " is not available (", n, " CUDA devices present)");
  if (r.cuda.size() < std::size_t(n)) r.cuda.resize(std::size_t(n));
  auto& slot = r.cuda[std::size_t(device.index)];
  if (!slot) slot = std::make_unique<CachingAllocator>(backend.make_memory_backend(device.index));
  return *slot;
}

}  // namespace remat
