#include "cuda/stream.h"

#include <cuda_runtime.h>

#include "engine/error.h"

namespace remat::cuda {

namespace {
thread_local StreamId tls_stream = 0;

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw DeviceError(std::string("CUDA ") + what + " failed: " + cudaGetErrorString(err));
  }
}
cudaStream_t as_stream(StreamId s) { return reinterpret_cast<cudaStream_t>(s); }
cudaEvent_t as_event(std::uintptr_t e) { return reinterpret_cast<cudaEvent_t>(e); }
}  // namespace

StreamId current_stream() { return tls_stream; }

StreamGuard::StreamGuard(StreamId stream) : previous_(tls_stream) { tls_stream = stream; }
StreamGuard::~StreamGuard() { tls_stream = previous_; }

Stream::Stream() {
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  id_ = reinterpret_cast<StreamId>(s);
}
Stream::~Stream() {
  if (id_) cudaStreamDestroy(as_stream(id_));
}
void Stream::synchronize() const { check(cudaStreamSynchronize(as_stream(id_)), "cudaStreamSynchronize"); }

Event::Event() {
  cudaEvent_t e = nullptr;
  check(cudaEventCreate(&e), "cudaEventCreate");
  id_ = reinterpret_cast<std::uintptr_t>(e);
}
Event::~Event() {
  if (id_) cudaEventDestroy(as_event(id_));
}
void Event::record(StreamId stream) { check(cudaEventRecord(as_event(id_), as_stream(stream)), "cudaEventRecord"); }
void Event::wait(StreamId stream) const {
  check(cudaStreamWaitEvent(as_stream(stream), as_event(id_), 0), "cudaStreamWaitEvent");
}
void Event::synchronize() const { check(cudaEventSynchronize(as_event(id_)), "cudaEventSynchronize"); }
float Event::elapsed_ms(const Event& later) const {
  float ms = 0;
  check(cudaEventElapsedTime(&ms, as_event(id_), as_event(later.id_)), "cudaEventElapsedTime");
  return ms;
}

}  // namespace remat::cuda
