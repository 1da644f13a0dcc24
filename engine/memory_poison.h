// Poisoning of cached host memory for AddressSanitizer. In a build with ASan
// (./remat test --asan, the fuzz build) the CPU caching allocator marks the
// bytes of a block unaddressable while the block sits in its cache and marks
// them addressable again when it hands the block out, so a read or write
// through a dangling pointer into a freed tensor's storage is reported
// ("use-after-poison") instead of silently touching the block's next owner.
// Without ASan the calls do nothing but feed the test seam below.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define REMAT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define REMAT_ASAN 1
#endif
#endif
#ifndef REMAT_ASAN
#define REMAT_ASAN 0
#endif

namespace remat::detail {

// True when this build has AddressSanitizer, so poisoning is real.
inline constexpr bool kAsanBuild = REMAT_ASAN != 0;

// Marks the host bytes [ptr, ptr + bytes) unaddressable (ASan builds).
void poison_host_memory(const void* ptr, std::size_t bytes);

// Marks the host bytes [ptr, ptr + bytes) addressable again (ASan builds).
void unpoison_host_memory(const void* ptr, std::size_t bytes);

// True when ASan reports the byte at `ptr` as poisoned (always false
// without ASan).
bool host_memory_poisoned(const void* ptr);

// One poison or unpoison call, as PoisonRecorder sees it.
struct PoisonCall {
  bool poison = false;  // true: poisoned, false: unpoisoned
  std::uintptr_t begin = 0;
  std::size_t bytes = 0;
  bool operator==(const PoisonCall&) const = default;
};

// Test seam: while alive, records every poison and unpoison call made on the
// thread that created it (in every build, ASan or not). Recorders nest; the
// innermost one records.
class PoisonRecorder {
 public:
  PoisonRecorder();
  ~PoisonRecorder();
  PoisonRecorder(const PoisonRecorder&) = delete;
  PoisonRecorder& operator=(const PoisonRecorder&) = delete;

  // The calls so far, oldest first.
  const std::vector<PoisonCall>& calls() const { return calls_; }

 private:
  friend void poison_host_memory(const void* ptr, std::size_t bytes);
  friend void unpoison_host_memory(const void* ptr, std::size_t bytes);
  std::vector<PoisonCall> calls_;
  PoisonRecorder* previous_;
};

}  // namespace remat::detail
