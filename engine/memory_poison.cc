#include "engine/memory_poison.h"

#if REMAT_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace remat::detail {

namespace {
thread_local PoisonRecorder* tls_recorder = nullptr;
}  // namespace

PoisonRecorder::PoisonRecorder() : previous_(tls_recorder) { tls_recorder = this; }
PoisonRecorder::~PoisonRecorder() { tls_recorder = previous_; }

void poison_host_memory(const void* ptr, std::size_t bytes) {
  if (tls_recorder)
    tls_recorder->calls_.push_back({true, reinterpret_cast<std::uintptr_t>(ptr), bytes});
#if REMAT_ASAN
  ASAN_POISON_MEMORY_REGION(ptr, bytes);
#endif
}

void unpoison_host_memory(const void* ptr, std::size_t bytes) {
  if (tls_recorder)
    tls_recorder->calls_.push_back({false, reinterpret_cast<std::uintptr_t>(ptr), bytes});
#if REMAT_ASAN
  ASAN_UNPOISON_MEMORY_REGION(ptr, bytes);
#endif
}

bool host_memory_poisoned(const void* ptr) {
#if REMAT_ASAN
  return __asan_address_is_poisoned(ptr) != 0;
#else
  (void)ptr;
  return false;
#endif
}

}  // namespace remat::detail
