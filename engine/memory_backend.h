// The seam between the caching allocator and a device's raw memory API.
// CPU memory is one implementation (engine/allocator.cc), cudaMalloc and CUDA
// events another (cuda/allocator_backend.cc). The allocator never includes a
// device API header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "engine/device.h"

namespace remat {

// An opaque stream id. 0 is the device's default stream; for CUDA the value is
// a cudaStream_t. CPU work runs on stream 0 only.
using StreamId = std::uintptr_t;

// An opaque event handle returned by MemoryBackend::record_event.
using EventId = std::uintptr_t;

class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;

  // The device whose memory this backend hands out.
  virtual Device device() const = 0;
  // Reserves `bytes` of device memory; returns nullptr when the device has
  // none left (the allocator then frees its cache and retries).
  virtual void* raw_alloc(std::size_t bytes) = 0;
  // Returns memory obtained from raw_alloc.
  virtual void raw_free(void* ptr) = 0;
  // Records an event on `stream` that completes when work queued so far on
  // that stream is done. Backends without streams return 0.
  virtual EventId record_event(StreamId /*stream*/) { return 0; }
  // True once the event has completed (always true for event 0).
  virtual bool event_done(EventId /*event*/) { return true; }
  // Releases an event from record_event.
  virtual void destroy_event(EventId /*event*/) {}
};

}  // namespace remat
