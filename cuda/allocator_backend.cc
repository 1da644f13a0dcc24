#include "cuda/allocator_backend.h"

#include <cuda_runtime.h>

#include "engine/error.h"

namespace remat::cuda {

namespace {

// Restores the calling thread's current device when it goes out of scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

class CudaMemoryBackend final : public MemoryBackend {
 public:
  explicit CudaMemoryBackend(int device) : device_(device) {}

  Device device() const override { return cuda_device(device_); }

  void* raw_alloc(std::size_t bytes) override {
    DeviceGuard guard(device_);
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error so later calls work
      return nullptr;
    }
    return p;
  }

  void raw_free(void* ptr) override {
    DeviceGuard guard(device_);
    cudaFree(ptr);
  }

  EventId record_event(StreamId stream) override {
    DeviceGuard guard(device_);
    cudaEvent_t ev = nullptr;
    cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    cudaEventRecord(ev, reinterpret_cast<cudaStream_t>(stream));
    return reinterpret_cast<EventId>(ev);
  }

  bool event_done(EventId event) override {
    if (event == 0) return true;
    cudaError_t err = cudaEventQuery(reinterpret_cast<cudaEvent_t>(event));
    if (err == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    return true;
  }

  void destroy_event(EventId event) override {
    if (event != 0) cudaEventDestroy(reinterpret_cast<cudaEvent_t>(event));
  }

 private:
  int device_;
};

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<MemoryBackend> make_allocator_backend(int device) {
  const int n = device_count();
  REMAT_CHECK(device >= 0 && device < n, DeviceError, "CUDA device ", device,
              " is not available (", n, " present)");
  return std::make_unique<CudaMemoryBackend>(device);
}

}  // namespace remat::cuda
