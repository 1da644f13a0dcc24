// Devices as code above the engine sees them: how many CUDA devices there are
// and what they are, the calling thread's current device and stream, side
// streams and events, and waiting for a device. Everything here goes through
// the registered device back end (engine/device_backend.h); in a binary
// without one (a build without CUDA, or one that does not link //cuda) there
// are no CUDA devices, and each call that needs a device throws DeviceError
// "no CUDA device" naming it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/device.h"
#include "engine/memory_backend.h"

namespace remat {

// What the benchmarks and `remat info` report about a device.
struct DeviceInfo {
  std::string name;
  int major = 0, minor = 0;  // compute capability
  int multiprocessors = 0;
  int clock_khz = 0;  // peak SM clock
  std::size_t memory_bytes = 0;
};

// True if this binary has a CUDA back end (the linked-in cuda/ registered one).
bool cuda_built();
// Usable CUDA devices: 0 without a back end, a driver or a GPU. Never throws.
int cuda_device_count();
// Properties of CUDA device `device`; throws DeviceError if it is absent.
DeviceInfo device_info(Device device);
// Makes CUDA device `device` current on the calling thread (nothing for the
// CPU or meta); throws DeviceError if it is absent.
void set_current_device(Device device);
// Makes `device` current when it is a CUDA device that is present; otherwise
// does nothing (the first use of an absent device then says why).
void use_device_if_present(Device device);
// Blocks until all work queued on `device` is done (nothing for the CPU or
// meta).
void synchronize(Device device);

// The calling thread's current stream: every kernel the engine and the ops
// launch goes on it. 0 (the device's legacy default stream, so work runs in
// the order it was queued) unless a StreamGuard is active.
StreamId current_stream();

// RAII: makes `stream` the thread's current stream for the guard's lifetime.
class StreamGuard {
 public:
  explicit StreamGuard(StreamId stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  StreamId previous_;
};

// An owned non-blocking stream on the current CUDA device; throws DeviceError
// without one.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  StreamId id() const { return id_; }
  // Waits until all work queued on the stream is done.
  void synchronize() const;

 private:
  StreamId id_ = 0;
};

// An owned CUDA event with timing (so elapsed_ms works); throws DeviceError
// without a CUDA device.
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Captures the work queued on `stream` so far.
  void record(StreamId stream);
  // Makes later work on `stream` wait for this event (no host blocking).
  void wait(StreamId stream) const;
  // Blocks the host until the event completes.
  void synchronize() const;
  // True once the work the event captured is done (or it was never
  // recorded); never blocks.
  bool query() const;
  // Milliseconds between this and a later recorded, completed event.
  float elapsed_ms(const Event& later) const;

 private:
  EventId id_ = 0;
};

// Owned page-locked host memory on the current CUDA device's context, for
// copy_async (empty when default-constructed). Throws DeviceError without a
// CUDA device or when the allocation fails, naming the size.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

// Queues a copy of `bytes` between CUDA device memory and pinned host memory
// (a PinnedBuffer; either way, or device to device) on `stream` and returns
// without waiting: both sides must stay valid, and the destination unread,
// until the work is done (record an Event on `stream` after it). Throws
// DeviceError without a CUDA device.
void copy_async(void* dst, const void* src, std::size_t bytes, StreamId stream);

}  // namespace remat
