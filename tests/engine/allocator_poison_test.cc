// The caching allocator's ASan poisoning (engine/memory_poison.h): which byte
// ranges it poisons and unpoisons, checked through the recording seam in every
// build; the [asan] cases check the shadow memory itself (./remat test --asan).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <ostream>

#include "engine/allocator.h"
#include "engine/memory_poison.h"
#include "engine/tensor.h"

using namespace remat;
using detail::PoisonCall;
using detail::PoisonRecorder;

namespace remat::detail {
std::ostream& operator<<(std::ostream& os, const PoisonCall& c) {
  return os << (c.poison ? "poison(" : "unpoison(") << std::hex << "0x" << c.begin << std::dec
            << ", " << c.bytes << ")";
}
}  // namespace remat::detail

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * 1024;

PoisonCall poisoned(const void* p, std::size_t bytes) {
  return {true, reinterpret_cast<std::uintptr_t>(p), bytes};
}

PoisonCall unpoisoned(const void* p, std::size_t bytes) {
  return {false, reinterpret_cast<std::uintptr_t>(p), bytes};
}

using Calls = std::vector<PoisonCall>;

// Host memory under a given device type, with streams whose events complete
// only when the test says so.
class FakeBackend final : public MemoryBackend {
 public:
  explicit FakeBackend(Device device) : device_(device) {}
  Device device() const override { return device_; }
  void* raw_alloc(std::size_t bytes) override { return std::aligned_alloc(64, bytes); }
  void raw_free(void* p) override { std::free(p); }
  EventId record_event(StreamId) override { return 1; }
  bool event_done(EventId) override { return *done; }
  std::shared_ptr<bool> done = std::make_shared<bool>(false);

 private:
  Device device_;
};

}  // namespace

TEST_CASE("a fresh segment is poisoned whole and the block handed out is unpoisoned at its "
          "rounded size", "[allocator][poison]") {
  CachingAllocator a(make_cpu_memory_backend());
  PoisonRecorder rec;
  DataPtr p = a.allocate(1000);  // rounds to 1024 in a 2 MiB small segment
  const char* seg = static_cast<const char*>(p.get());
  CHECK(rec.calls() == Calls{poisoned(seg, 2 * MiB), unpoisoned(seg, 1024)});
  DataPtr q = a.allocate(1);  // the next 512 bytes of the same segment
  CHECK(q.get() == seg + 1024);
  CHECK(rec.calls().back() == unpoisoned(seg + 1024, 512));
  CHECK(rec.calls().size() == 3);
}

TEST_CASE("a freed block is poisoned exactly, before it merges with free neighbours",
          "[allocator][poison]") {
  CachingAllocator a(make_cpu_memory_backend());
  DataPtr x = a.allocate(512 * KiB);
  DataPtr y = a.allocate(300 * KiB);
  DataPtr z = a.allocate(100 * KiB);
  const void* xp = x.get();
  const void* yp = y.get();
  REQUIRE(yp == static_cast<const char*>(xp) + 512 * KiB);
  PoisonRecorder rec;
  y.reset();  // next to allocated x and z: no merge
  x.reset();  // merges with y afterwards: only x's own bytes are poisoned
  z.reset();  // merges with x+y before and the segment's free rest after
  CHECK(rec.calls() == Calls{poisoned(yp, 300 * KiB), poisoned(xp, 512 * KiB),
                             poisoned(static_cast<const char*>(xp) + 812 * KiB, 100 * KiB)});
  // The whole segment is one cached block again: handing out 5000 bytes
  // unpoisons the rounded 5120 and nothing more.
  DataPtr w = a.allocate(5000);
  CHECK(w.get() == xp);
  CHECK(rec.calls().back() == unpoisoned(xp, 5120));
  CHECK(rec.calls().size() == 4);
}

TEST_CASE("a cached block handed out unsplit keeps its tail beyond the request poisoned",
          "[allocator][poison]") {
  CachingAllocator a(make_cpu_memory_backend());
  DataPtr x = a.allocate(3 * MiB);  // in a 20 MiB segment; 17 MiB stay cached
  const char* seg = static_cast<const char*>(x.get());
  PoisonRecorder rec;
  // 16.5 MiB fits the cached 17 MiB; the 0.5 MiB rest is too small to split.
  DataPtr y = a.allocate(16 * MiB + 512 * KiB - 100);
  CHECK(y.get() == seg + 3 * MiB);
  CHECK(a.stats().allocated_bytes == std::int64_t(20 * MiB));  // the block is all 17 MiB
  y.reset();
  CHECK(rec.calls() == Calls{unpoisoned(seg + 3 * MiB, 16 * MiB + 512 * KiB),
                             poisoned(seg + 3 * MiB, 17 * MiB)});
}

TEST_CASE("a cached segment is unpoisoned before it goes back to the backend",
          "[allocator][poison]") {
  CachingAllocator a(make_cpu_memory_backend());
  const void* small;
  const void* large;
  {
    DataPtr p = a.allocate(1000);
    DataPtr q = a.allocate(12 * MiB);  // its own 12 MiB segment
    small = p.get();
    large = q.get();
  }
  PoisonRecorder rec;
  a.empty_cache();
  CHECK(rec.calls() == Calls{unpoisoned(small, 2 * MiB), unpoisoned(large, 12 * MiB)});
  CHECK(a.stats().reserved_bytes == 0);
}

TEST_CASE("the flush before a retried reservation unpoisons what it releases",
          "[allocator][poison]") {
  CachingAllocator a(make_cpu_memory_backend());
  a.set_memory_limit(16 * MiB);
  const void* cached;
  {
    DataPtr p = a.allocate(12 * MiB);
    cached = p.get();
  }
  PoisonRecorder rec;
  DataPtr big = a.allocate(13 * MiB);  // fits only once the 12 MiB segment is gone
  REQUIRE(rec.calls().size() == 3);
  CHECK(rec.calls()[0] == unpoisoned(cached, 12 * MiB));
  CHECK(rec.calls()[1] == poisoned(big.get(), 14 * MiB));
  CHECK(rec.calls()[2] == unpoisoned(big.get(), 13 * MiB));
}

TEST_CASE("the destructor unpoisons every segment it still holds, whole",
          "[allocator][poison]") {
  PoisonRecorder rec;
  const void* seg;
  {
    CachingAllocator a(std::make_unique<FakeBackend>(kCPU));  // its events never complete
    DataPtr p = a.allocate(4096);
    seg = p.get();
    a.record_stream(p.get(), /*stream=*/7);
    p.reset();  // waits for stream 7: not cached, not poisoned yet
    CHECK(rec.calls() == Calls{poisoned(seg, 2 * MiB), unpoisoned(seg, 4096)});
  }
  // The segment was two blocks, the pending one and the cached rest.
  CHECK(rec.calls().size() == 3);
  CHECK(rec.calls().back() == unpoisoned(seg, 2 * MiB));
}

TEST_CASE("a block freed behind another stream's work is poisoned once it reaches the cache",
          "[allocator][poison]") {
  auto backend = std::make_unique<FakeBackend>(kCPU);
  auto done = backend->done;
  CachingAllocator a(std::move(backend));
  DataPtr p = a.allocate(4096);
  const void* addr = p.get();
  a.record_stream(p.get(), /*stream=*/7);
  PoisonRecorder rec;
  p.reset();
  CHECK(rec.calls().empty());
  *done = true;
  DataPtr q = a.allocate(100 * KiB);  // processes the pending free first
  REQUIRE(rec.calls().size() == 2);
  CHECK(rec.calls()[0] == poisoned(addr, 4096));
  CHECK(rec.calls()[1] == unpoisoned(q.get(), 100 * KiB));
}

TEST_CASE("device memory is never poisoned: it is not host memory", "[allocator][poison]") {
  CachingAllocator a(std::make_unique<FakeBackend>(cuda_device(0)));
  PoisonRecorder rec;
  a.allocate(1000).reset();
  a.allocate(12 * MiB).reset();
  a.empty_cache();
  CHECK(a.stats().num_device_frees == 2);
  CHECK(rec.calls().empty());
}

TEST_CASE("a freed tensor's storage is poisoned in the CPU allocator's cache",
          "[allocator][poison]") {
  PoisonRecorder rec;
  Tensor t = zeros({300});  // 1200 bytes: a 1536-byte block
  const void* p = t.raw_data();
  REQUIRE(!rec.calls().empty());
  CHECK(rec.calls().back() == unpoisoned(p, 1536));
  t = Tensor();
  CHECK(rec.calls().back() == poisoned(p, 1536));
}

TEST_CASE("ASan sees a cached block poisoned and a handed-out one addressable",
          "[allocator][poison][asan]") {
  CachingAllocator a(make_cpu_memory_backend());
  DataPtr p = a.allocate(1000);
  const char* b = static_cast<const char*>(p.get());
  CHECK_FALSE(detail::host_memory_poisoned(b));
  CHECK_FALSE(detail::host_memory_poisoned(b + 1023));  // the rounded size is the block's
  CHECK(detail::host_memory_poisoned(b + 1024));        // the segment's cached rest
  p.reset();
  CHECK(detail::host_memory_poisoned(b));
  CHECK(detail::host_memory_poisoned(b + 1023));
  DataPtr q = a.allocate(500);
  REQUIRE(q.get() == b);
  CHECK_FALSE(detail::host_memory_poisoned(b + 511));
  CHECK(detail::host_memory_poisoned(b + 512));
  q.reset();
  a.empty_cache();  // the segment leaves unpoisoned: free() and ASan own it again
  CHECK(a.stats().reserved_bytes == 0);
}
