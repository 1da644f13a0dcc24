// CUDA streams and events, and the thread's current stream: every kernel the
// ops launch goes on cuda::current_stream(). The default is the device's
// legacy default stream (0), so work is ordered as it was queued unless a
// caller opts into a side stream with StreamGuard.
#pragma once

#include "engine/memory_backend.h"

namespace remat::cuda {

// The calling thread's current stream (0 unless a StreamGuard is active).
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

// An owned non-blocking stream on the current device.
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

// An owned event (timing enabled, so elapsed_ms works).
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
  // Milliseconds between two recorded, completed events.
  float elapsed_ms(const Event& later) const;

 private:
  std::uintptr_t id_ = 0;
};

}  // namespace remat::cuda
