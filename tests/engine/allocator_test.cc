#include <catch2/catch.hpp>

#include <numeric>
#include <thread>

#include "engine/allocator.h"
#include "engine/error.h"

using namespace remat;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * 1024;


std::int64_t sum(const std::array<std::int64_t, kNumMemoryCategories>& a) {
  return std::accumulate(a.begin(), a.end(), std::int64_t(0));
}

// Host memory with fake streams: events complete only when the test says so.
class FakeStreamBackend final : public MemoryBackend {
 public:
  Device device() const override { return kCPU; }
  void* raw_alloc(std::size_t bytes) override { return std::aligned_alloc(64, bytes); }
  void raw_free(void* p) override { std::free(p); }
  EventId record_event(StreamId) override {
    ++events_recorded;
    return EventId(events_recorded);
  }
  bool event_done(EventId) override { return *done; }
  std::shared_ptr<bool> done = std::make_shared<bool>(false);
  int events_recorded = 0;
};

}  // namespace

TEST_CASE("a freed block is reused without a new reservation", "[allocator]") {
  CachingAllocator a(make_cpu_memory_backend());
  void* first;
  {
    DataPtr p = a.allocate(1000);
    first = p.get();
  }
  const auto s1 = a.stats();
  CHECK(s1.num_device_allocs == 1);
  CHECK(s1.allocated_bytes == 0);
  CHECK(s1.reserved_bytes == std::int64_t(CachingAllocator::kSmallSegment));
  DataPtr q = a.allocate(900);
  CHECK(q.get() == first);
  const auto s2 = a.stats();
  CHECK(s2.num_device_allocs == 1);
  CHECK(s2.cache_hits == 1);
  CHECK(s2.reserved_bytes == s1.reserved_bytes);
}

TEST_CASE("blocks split from one segment and coalesce when freed", "[allocator]") {
  CachingAllocator a(make_cpu_memory_backend());
  DataPtr x = a.allocate(512 * KiB);
  DataPtr y = a.allocate(512 * KiB);
  DataPtr z = a.allocate(512 * KiB);
  CHECK(a.stats().num_device_allocs == 1);  // all three carved from one 2 MiB segment
  char* base = static_cast<char*>(x.get());
  CHECK(static_cast<char*>(y.get()) == base + 512 * KiB);
  CHECK(static_cast<char*>(z.get()) == base + 1024 * KiB);
  // Free the first two: they merge into one 1 MiB block that a 1 MiB request fits.
  y.reset();
  x.reset();
  DataPtr w = a.allocate(1 * MiB);
  CHECK(w.get() == base);
  CHECK(a.stats().num_device_allocs == 1);
  w.reset();
  z.reset();
  // Everything merged back into one whole segment, so the cache can release it.
  a.empty_cache();
  const auto s = a.stats();
  CHECK(s.reserved_bytes == 0);
  CHECK(s.num_device_frees == 1);
}

TEST_CASE("a large request in a larger cached block splits off a tail over half a MiB", "[allocator]") {
  CachingAllocator a(make_cpu_memory_backend());
  DataPtr first = a.allocate(2 * MiB);  // both in one 20 MiB segment
  DataPtr second = a.allocate(3 * MiB);
  const char* at = static_cast<const char*>(first.get());
  first.reset();  // a cached 2 MiB block between the segment's start and `second`
  // A 1.34 MiB activation (a [4, 256, 344] f32 under --tp 4) takes the best
  // fit, the 2 MiB block, and leaves its 0.66 MiB tail free.
  DataPtr act = a.allocate(1409024);
  CHECK(static_cast<const char*>(act.get()) == at);
  CHECK(a.stats().allocated_bytes == std::int64_t(1409024 + 3 * MiB));
}

TEST_CASE("stats are exact for a scripted sequence", "[allocator]") {
  CachingAllocator a(make_cpu_memory_backend());
  DataPtr p1 = a.allocate(100);       // -> 512, small segment (2 MiB)
  DataPtr p2 = a.allocate(1000);      // -> 1024, same segment
  DataPtr p3 = a.allocate(3 * MiB);   // large: 3 MiB block in a 20 MiB segment
  auto s = a.stats();
  CHECK(s.allocated_bytes == 512 + 1024 + 3 * MiB);
  CHECK(s.requested_bytes == 100 + 1000 + 3 * MiB);
  CHECK(s.reserved_bytes == std::int64_t(2 * MiB + 20 * MiB));
  CHECK(s.num_device_allocs == 2);
  CHECK(s.num_allocs == 3);
  CHECK(s.allocated_peak == s.allocated_bytes);
  p3.reset();
  // The freed 3 MiB merged back into its free 20 MiB segment, which now
  // serves a 12 MiB request (best fit, split) without a new reservation.
  DataPtr p4 = a.allocate(12 * MiB);
  s = a.stats();
  CHECK(s.allocated_bytes == 512 + 1024 + 12 * MiB);
  CHECK(s.allocated_peak == 512 + 1024 + 12 * MiB);
  CHECK(s.reserved_bytes == std::int64_t(2 * MiB + 20 * MiB));
  CHECK(s.num_device_allocs == 2);
  CHECK(s.cache_hits == 2);  // p2 (small segment) and p4
  CHECK(s.num_frees == 1);
  // A request larger than any cached block gets its own segment (>= 10 MiB:
  // rounded up to 2 MiB).
  DataPtr p5 = a.allocate(11 * MiB - 100);
  CHECK(a.stats().reserved_bytes == std::int64_t(2 * MiB + 20 * MiB + 12 * MiB));
  p5.reset();
  p4.reset();
  p1.reset();
  s = a.stats();
  CHECK(s.allocated_bytes == 1024);
  // p5 took 11 MiB of its 12 MiB segment: a 1 MiB remainder is split off
  // (over kMinLargeSplit, half a MiB).
  CHECK(s.allocated_peak == 512 + 1024 + 12 * MiB + 11 * MiB);
  a.reset_peak();
  CHECK(a.stats().allocated_peak == 1024);
  CHECK(a.stats().reserved_peak == std::int64_t(34 * MiB));
  CHECK(a.allocate(0).get() == nullptr);
}

TEST_CASE("categories add up to the total, at the peak too", "[allocator]") {
  CachingAllocator a(make_cpu_memory_backend());
  std::vector<DataPtr> keep;
  {
    CategoryScope c(MemoryCategory::parameter);
    keep.push_back(a.allocate(4 * KiB));
    {
      CategoryScope inner(MemoryCategory::activation);
      keep.push_back(a.allocate(8 * KiB));
      keep.push_back(a.allocate(2 * MiB));
    }
    CHECK(current_category() == MemoryCategory::parameter);
    keep.push_back(a.allocate(1 * KiB));
  }
  CHECK(current_category() == MemoryCategory::other);
  {
    CategoryScope c(MemoryCategory::gradient);
    keep.push_back(a.allocate(5 * KiB));
  }
  auto s = a.stats();
  CHECK(s.category(MemoryCategory::parameter) == std::int64_t(5 * KiB));
  CHECK(s.category(MemoryCategory::activation) == std::int64_t(8 * KiB + 2 * MiB));
  CHECK(s.category(MemoryCategory::gradient) == std::int64_t(5 * KiB));
  CHECK(sum(s.category_bytes) == s.allocated_bytes);
  CHECK(sum(s.category_bytes_at_peak) == s.allocated_peak);
  keep.erase(keep.begin() + 2);  // drop the 2 MiB activation
  s = a.stats();
  CHECK(sum(s.category_bytes) == s.allocated_bytes);
  CHECK(s.category_at_peak(MemoryCategory::activation) == std::int64_t(8 * KiB + 2 * MiB));
  CHECK(sum(s.category_bytes_at_peak) == s.allocated_peak);
  CHECK(s.category_peak[std::size_t(MemoryCategory::activation)] == std::int64_t(8 * KiB + 2 * MiB));
}

TEST_CASE("an over-limit allocation raises the documented error and leaves the allocator usable",
          "[allocator]") {
  CachingAllocator a(make_cpu_memory_backend());
  a.set_memory_limit(8 * MiB);
  std::vector<DataPtr> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(a.allocate(1 * MiB));  // two per 2 MiB segment
  CHECK(a.stats().reserved_bytes == std::int64_t(8 * MiB));
  try {
    TagScope tag("matmul");
    CategoryScope cat(MemoryCategory::activation);
    DataPtr too_much = a.allocate(1 * MiB);
    FAIL("expected OutOfMemoryError");
  } catch (const OutOfMemoryError& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("out of memory on cpu: tried to allocate 1.00 MiB"));
    CHECK_THAT(msg, Catch::Contains("category activation"));
    CHECK_THAT(msg, Catch::Contains("op 'matmul'"));
    CHECK_THAT(msg, Catch::Contains("allocated 8.00 MiB in 8 blocks"));
    CHECK_THAT(msg, Catch::Contains("reserved 8.00 MiB in 4 segments"));
    CHECK_THAT(msg, Catch::Contains("limit 8.00 MiB"));
  }
  auto s = a.stats();
  CHECK(s.num_ooms == 1);
  CHECK(s.allocated_bytes == std::int64_t(8 * MiB));
  // Still usable: after freeing a block, the request fits again.
  blocks.pop_back();
  DataPtr ok = a.allocate(1 * MiB);
  CHECK(ok);
  CHECK(a.stats().allocated_bytes == std::int64_t(8 * MiB));
  CHECK(a.stats().num_ooms == 1);
}

TEST_CASE("a failed reservation flushes the cache and retries", "[allocator]") {
  CachingAllocator a(make_cpu_memory_backend());
  a.set_memory_limit(16 * MiB);
  a.allocate(12 * MiB).reset();  // caches a 12 MiB segment
  a.allocate(1 * KiB).reset();   // caches a 2 MiB small segment
  CHECK(a.stats().reserved_bytes == std::int64_t(14 * MiB));
  DataPtr big = a.allocate(13 * MiB);  // needs 14 MiB more: only after the flush
  auto s = a.stats();
  CHECK(s.num_alloc_retries == 1);
  CHECK(s.num_ooms == 0);
  CHECK(s.reserved_bytes == std::int64_t(14 * MiB));
}

TEST_CASE("the history ring buffer keeps the newest events with tags", "[allocator]") {
  CachingAllocator a(make_cpu_memory_backend());
  a.enable_history(4);
  {
    TagScope t("first");
    a.allocate(100).reset();  // segment_alloc, alloc, free
  }
  a.mark("backward");
  {
    TagScope t("second");
    CategoryScope c(MemoryCategory::gradient);
    DataPtr p = a.allocate(100);  // alloc (cache hit)
    const auto h = a.history();
    // Five events happened (segment_alloc, alloc, free, marker, alloc); the
    // ring keeps the newest four, oldest first.
    REQUIRE(h.size() == 4);
    CHECK(h[0].seq == 1);
    CHECK(h[0].kind == MemoryEvent::Kind::alloc);
    CHECK(h[0].tag == "first");
    CHECK(h[1].kind == MemoryEvent::Kind::free);
    CHECK(h[1].allocated_after == 0);
    CHECK(h[2].kind == MemoryEvent::Kind::marker);
    CHECK(h[2].tag == "backward");
    CHECK(h[3].kind == MemoryEvent::Kind::alloc);
    CHECK(h[3].tag == "second");
    CHECK(h[3].category == MemoryCategory::gradient);
    CHECK(h[3].allocated_after == 512);
    CHECK(h[3].time_ns >= h[0].time_ns);
  }
}

TEST_CASE("a block used by another stream is not reused until its event completes",
          "[allocator]") {
  auto backend = std::make_unique<FakeStreamBackend>();
  auto done = backend->done;
  FakeStreamBackend* raw = backend.get();
  CachingAllocator a(std::move(backend));
  DataPtr p = a.allocate(4096, /*stream=*/0);
  void* addr = p.get();
  a.record_stream(addr, /*stream=*/7);
  p.reset();
  CHECK(raw->events_recorded == 1);
  auto s = a.stats();
  CHECK(s.allocated_bytes == 0);
  CHECK(s.active_bytes == 4096);  // still in use by stream 7
  DataPtr q = a.allocate(4096, 0);
  CHECK(q.get() != addr);
  q.reset();
  *done = true;
  DataPtr r = a.allocate(4096, 0);
  CHECK(r.get() == addr);
  CHECK(a.stats().active_bytes == 4096);
}

TEST_CASE("blocks of different streams come from different pools", "[allocator]") {
  CachingAllocator a(make_cpu_memory_backend());
  a.allocate(4096, 1).reset();
  DataPtr p = a.allocate(4096, 2);
  CHECK(a.stats().num_device_allocs == 2);
  CHECK(a.stats().cache_hits == 0);
}

TEST_CASE("concurrent allocation from two threads keeps the stats consistent", "[allocator]") {
  CachingAllocator a(make_cpu_memory_backend());
  auto work = [&] {
    std::vector<DataPtr> live;
    for (int i = 0; i < 2000; ++i) {
      live.push_back(a.allocate(std::size_t(512 + (i % 7) * 3000)));
      if (live.size() > 5) live.erase(live.begin());
    }
  };
  std::thread t1(work), t2(work);
  t1.join();
  t2.join();
  const auto s = a.stats();
  CHECK(s.allocated_bytes == 0);
  CHECK(s.num_allocs == 4000);
  CHECK(s.num_frees == 4000);
  CHECK(s.active_bytes == 0);
}

namespace {
// Frees the newest of its blocks whenever asked (dynamic remat's role).
struct FreeNewest final : MemoryPressureHandler {
  std::int64_t limit = 0;
  std::vector<DataPtr> held;
  std::vector<std::pair<std::int64_t, std::int64_t>> asked;  // (allocated, charge)
  Device device() const override { return kCPU; }
  std::int64_t budget() const override { return limit; }
  bool relieve(CachingAllocator&, std::int64_t allocated, std::int64_t charge) override {
    asked.emplace_back(allocated, charge);
    if (held.empty()) return false;
    held.pop_back();
    return true;
  }
};
}  // namespace

TEST_CASE("a pressure handler frees memory before an allocation would pass its budget", "[allocator]") {
  CachingAllocator a(make_cpu_memory_backend());
  FreeNewest h;
  h.limit = 3 * 4096;
  MemoryPressureScope scope(h);
  for (int i = 0; i < 3; ++i) h.held.push_back(a.allocate(4096));
  CHECK(h.asked.empty());  // 12 KiB: at the budget, not over it
  DataPtr more = a.allocate(4096);
  REQUIRE(h.asked.size() == 1);
  CHECK(h.asked[0] == std::make_pair(std::int64_t(3 * 4096), std::int64_t(4096)));
  CHECK(a.stats().allocated_bytes == 3 * 4096);
  CHECK(a.stats().allocated_peak <= h.limit);
  // Nothing left to free: the allocation goes ahead over the budget.
  h.held.clear();
  h.limit = 4096;
  DataPtr over = a.allocate(8192);
  CHECK(over);
  CHECK(a.stats().allocated_bytes == 4096 + 8192);
}

TEST_CASE("a large request is charged the whole cached block it would take unsplit", "[allocator]") {
  CachingAllocator a(make_cpu_memory_backend());
  const std::size_t big = 3 << 20;
  { DataPtr p = a.allocate(big); }  // a cached 3 MiB block (in a 20 MiB segment: split from its tail)
  DataPtr keep_tail = a.allocate((20 << 20) - big);  // the rest of the segment is taken
  FreeNewest h;
  h.limit = std::int64_t(a.stats().allocated_bytes + big - 1);  // one byte short of the whole block
  MemoryPressureScope scope(h);
  DataPtr p = a.allocate(big - (256 << 10));  // a 256 KiB tail would stay with the block: charged 3 MiB
  REQUIRE(h.asked.size() == 1);
  CHECK(h.asked[0].second == std::int64_t(big));
}

TEST_CASE("free_run_if_freed: a block and its free neighbours", "[allocator]") {
  CachingAllocator a(make_cpu_memory_backend());
  DataPtr x = a.allocate(4096), y = a.allocate(4096), z = a.allocate(4096), w = a.allocate(4096);
  CHECK(a.free_run_if_freed(y.get()) == 4096);
  x.reset();
  z.reset();
  CHECK(a.free_run_if_freed(y.get()) == 3 * 4096);  // x, y and z merge
  CHECK(a.free_run_if_freed(w.get()) >= 2 * 4096);  // z, w and the segment's free tail
  CHECK(a.free_run_if_freed(nullptr) == 0);
}
