// The caching allocator: one design for every device. It reserves large
// segments from a MemoryBackend, carves blocks out of them (best fit, split),
// merges free neighbours back (coalesce), and keeps freed blocks cached for
// reuse instead of returning them to the device. Every allocation carries a
// memory category and a short tag (usually the op that asked), so memory can
// be attributed and drawn over time.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/device.h"
#include "engine/memory_backend.h"

namespace remat {

// What an allocation is for. The current category is a thread-local set by
// CategoryScope; the default is `other`.
enum class MemoryCategory : std::uint8_t {
  parameter,
  gradient,
  optimizer,
  activation,
  recompute,
  workspace,
  communication,
  other,
  loss,  // the LM head's logits and the loss's (models/decoder.h loss_head)
};
inline constexpr std::size_t kNumMemoryCategories = 9;

// "parameter", "gradient", ...
const char* category_name(MemoryCategory c);

// The category new allocations on this thread get.
MemoryCategory current_category();

// RAII: allocations made on this thread while the scope lives get `c`.
class CategoryScope {
 public:
  explicit CategoryScope(MemoryCategory c);
  ~CategoryScope();
  CategoryScope(const CategoryScope&) = delete;
  CategoryScope& operator=(const CategoryScope&) = delete;

 private:
  MemoryCategory previous_;
};

// The tag new allocations on this thread get (an op name, "" when none).
const char* current_tag();

// RAII: allocations on this thread while the scope lives are tagged `tag`.
// The string must outlive the scope (op names are string literals).
class TagScope {
 public:
  explicit TagScope(const char* tag);
  ~TagScope();
  TagScope(const TagScope&) = delete;
  TagScope& operator=(const TagScope&) = delete;

 private:
  const char* previous_;
};

// The tag of host bookkeeping: the small host tensors a collective reads or
// writes for the program's own decisions (routing counts, the gradient
// buckets' order fingerprint, losses gathered from pipeline stages). They
// live in host memory on every device; a meta run, which stands for the
// device, keeps them on the host (docs/META.md).
inline constexpr const char* kHostTag = "host";

// Allocator statistics for one device. Byte counts are of blocks (rounded
// sizes); `requested_bytes` is what callers asked for.
struct MemoryStats {
  std::int64_t allocated_bytes = 0;   // blocks handed out and not yet freed
  std::int64_t allocated_peak = 0;
  std::int64_t reserved_bytes = 0;    // segments obtained from the device
  std::int64_t reserved_peak = 0;
  std::int64_t active_bytes = 0;      // allocated + freed blocks still in use by another stream
  std::int64_t active_peak = 0;
  std::int64_t requested_bytes = 0;   // sum of requested sizes of live allocations
  std::int64_t num_allocs = 0;
  std::int64_t num_frees = 0;
  std::int64_t num_device_allocs = 0;  // segments reserved from the backend
  std::int64_t num_device_frees = 0;   // segments returned to the backend
  std::int64_t cache_hits = 0;         // allocations served without a new segment
  std::int64_t num_alloc_retries = 0;  // cache flushed to retry a failed reservation
  std::int64_t num_ooms = 0;
  // Current bytes per category; they add up to allocated_bytes.
  std::array<std::int64_t, kNumMemoryCategories> category_bytes{};
  // Bytes per category at the moment allocated_peak was last reached; they
  // add up to allocated_peak.
  std::array<std::int64_t, kNumMemoryCategories> category_bytes_at_peak{};
  // The highest value each category reached on its own.
  std::array<std::int64_t, kNumMemoryCategories> category_peak{};

  std::int64_t category(MemoryCategory c) const { return category_bytes[std::size_t(c)]; }
  std::int64_t category_at_peak(MemoryCategory c) const {
    return category_bytes_at_peak[std::size_t(c)];
  }
};

// One entry of the allocation history.
struct MemoryEvent {
  enum class Kind : std::uint8_t { alloc, free, segment_alloc, segment_free, marker };
  std::uint64_t seq = 0;        // position in the whole history
  std::int64_t time_ns = 0;     // steady clock, since the history was enabled
  Kind kind = Kind::alloc;
  std::uintptr_t ptr = 0;
  std::int64_t size = 0;        // block bytes (segment bytes for segment events)
  MemoryCategory category = MemoryCategory::other;
  std::string tag;              // op name, or the marker's label
  std::int64_t allocated_after = 0;
  std::int64_t reserved_after = 0;
};

const char* event_kind_name(MemoryEvent::Kind k);

class CachingAllocator;

// A budget on a device's allocated bytes, enforced by freeing memory before
// an allocation would exceed it (dynamic rematerialization evicts saved
// tensors: checkpoint/dynamic_remat.h). Installed per thread by
// MemoryPressureScope; allocations on other threads do not consult it.
class MemoryPressureHandler {
 public:
  virtual ~MemoryPressureHandler() = default;
  // The device whose allocations it watches.
  virtual Device device() const = 0;
  // The most bytes allocated on the device may be (0: no budget).
  virtual std::int64_t budget() const = 0;
  // An allocation would be charged `charge` bytes while `allocated` are
  // allocated, which exceeds budget(): free at least `charge + allocated -
  // budget()` bytes (a block of `charge` bytes would be best). Returns false
  // when it freed nothing, and the allocation then proceeds over the budget
  // (the handler throws OutOfMemoryError itself to refuse it). Runs outside
  // the allocator's lock; the allocator does not consult it again until it
  // returns.
  virtual bool relieve(CachingAllocator& allocator, std::int64_t allocated, std::int64_t charge) = 0;
};

// RAII: this thread's allocations on handler.device() consult `handler`
// while the scope lives (it must outlive the scope; scopes nest).
class MemoryPressureScope {
 public:
  explicit MemoryPressureScope(MemoryPressureHandler& handler);
  ~MemoryPressureScope();
  MemoryPressureScope(const MemoryPressureScope&) = delete;
  MemoryPressureScope& operator=(const MemoryPressureScope&) = delete;

 private:
  MemoryPressureHandler* previous_;
};

// Owning handle to one allocation; frees it on destruction. Move-only.
class DataPtr {
 public:
  DataPtr() = default;
  DataPtr(void* ptr, CachingAllocator* owner) : ptr_(ptr), owner_(owner) {}
  DataPtr(DataPtr&& other) noexcept;
  DataPtr& operator=(DataPtr&& other) noexcept;
  DataPtr(const DataPtr&) = delete;
  DataPtr& operator=(const DataPtr&) = delete;
  ~DataPtr();

  void* get() const { return ptr_; }
  explicit operator bool() const { return ptr_ != nullptr; }
  CachingAllocator* allocator() const { return owner_; }
  // Frees now (idempotent).
  void reset();

 private:
  void* ptr_ = nullptr;
  CachingAllocator* owner_ = nullptr;
};

class CachingAllocator {
 public:
  // Requests are rounded up to a multiple of kRoundBytes.
  static constexpr std::size_t kRoundBytes = 512;
  // Requests up to kSmallRequest bytes come from the small pool, whose
  // segments are kSmallSegment bytes.
  static constexpr std::size_t kSmallRequest = 1 << 20;
  static constexpr std::size_t kSmallSegment = 2 << 20;
  // Large requests under kMidRequest share kMidSegment segments; bigger ones
  // get a segment rounded up to kLargeRound.
  static constexpr std::size_t kMidRequest = 10 << 20;
  static constexpr std::size_t kMidSegment = 20 << 20;
  static constexpr std::size_t kLargeRound = 2 << 20;
  // A large block is split only if the remainder exceeds this. (Half a
  // MiB, not PyTorch's 1 MiB: a 1.4 MiB activation taking a cached 2 MiB
  // block whole wasted a third of it for as long as backward kept it; a
  // smaller tail stays with its block, as it could serve no small request.)
  static constexpr std::size_t kMinLargeSplit = 1 << 19;

  explicit CachingAllocator(std::unique_ptr<MemoryBackend> backend);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  Device device() const;

  // Returns at least `bytes` bytes (aligned to 512) for use on `stream`,
  // tagged with the thread's current category and tag. Zero bytes gives an
  // empty DataPtr. Throws OutOfMemoryError (after flushing the cache and
  // retrying once) naming the request and this allocator's state.
  DataPtr allocate(std::size_t bytes, StreamId stream = 0);

  // Marks the block at `ptr` as used by `stream` too: when freed it is not
  // reused until the work queued on `stream` by then has completed.
  void record_stream(void* ptr, StreamId stream);

  // Returns every fully free cached segment to the backend.
  void empty_cache();

  // Caps reserved bytes (0 = no cap). Reservations beyond it fail like a
  // device OOM, which makes OOM handling testable on CPU.
  void set_memory_limit(std::int64_t bytes);
  std::int64_t memory_limit() const;

  MemoryStats stats() const;
  // Sets every peak to its current value.
  void reset_peak();
  // Zeroes counters (allocs, frees, hits, retries, OOMs) and resets peaks.
  void reset_counters();

  // Records alloc/free/segment events in a ring buffer of `capacity` entries
  // (0 turns it off and drops the history).
  void enable_history(std::size_t capacity);
  // The recorded events, oldest first.
  std::vector<MemoryEvent> history() const;
  // Adds a marker event (e.g. "forward", "backward", "replay") to the history.
  void mark(const std::string& label);

  // The bytes of the free block that freeing the allocation at `ptr` would
  // leave (it merged with its free neighbours; 0 if `ptr` is not a live
  // allocation of this allocator, or other streams still use it).
  std::int64_t free_run_if_freed(const void* ptr) const;

  // One line describing the state: allocated, reserved, cached free bytes,
  // largest free block, limit, segment count.
  std::string describe() const;

  // Internal: called by DataPtr.
  void free(void* ptr);

 private:
  struct Block;
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BlockLess>;
  struct PendingFree {
    Block* block;
    std::vector<EventId> events;
  };

  Block* find_free_block(Pool& pool, std::size_t size, StreamId stream);
  // The bytes a request of `size` (rounded) would be charged now: its own
  // size, or the whole block it would take when the remainder is not split.
  std::size_t charge_locked(std::size_t size, StreamId stream) const;
  // Lets this thread's pressure handler free memory first (allocate()).
  void relieve_pressure(std::size_t size, StreamId stream);
  Block* reserve_segment(std::size_t segment_size, StreamId stream, bool small);
  bool release_cached_segments();
  void free_block(Block* block);
  void process_pending();
  void record(MemoryEvent::Kind kind, std::uintptr_t ptr, std::int64_t size,
              MemoryCategory cat, const std::string& tag);
  std::string describe_locked() const;
  void update_peaks();

  std::unique_ptr<MemoryBackend> backend_;
  mutable std::mutex mu_;
  Pool small_pool_;
  Pool large_pool_;
  std::unordered_map<void*, Block*> allocated_;
  Block* new_block();
  void recycle_block(Block* b);
  std::deque<Block> block_storage_;  // owns every Block; stable addresses
  std::vector<Block*> spare_blocks_;  // recycled entries of block_storage_
  std::vector<PendingFree> pending_;
  MemoryStats stats_;
  std::int64_t limit_ = 0;
  std::int64_t segments_ = 0;  // segments currently reserved
  std::uint64_t segments_reserved_ = 0;  // segments ever reserved (Block::segment)
  std::size_t history_capacity_ = 0;
  std::vector<MemoryEvent> history_;
  std::uint64_t history_seq_ = 0;
  std::int64_t history_t0_ns_ = 0;
};

// A backend over aligned host memory (the CPU allocator's; tests make their
// own private allocators with it).
std::unique_ptr<MemoryBackend> make_cpu_memory_backend();

// The allocator of a device: one per device, created on first use, alive for
// the whole process (meta's hands out addresses without memory). Throws
// DeviceError for a CUDA device that is not present.
CachingAllocator& allocator_for(Device device);

// Human-readable byte count, e.g. "1.50 MiB".
std::string format_bytes(std::int64_t bytes);

}  // namespace remat
