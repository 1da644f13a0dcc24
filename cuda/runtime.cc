#include "cuda/runtime.h"

#include <cuda_runtime.h>

#include "engine/error.h"

namespace remat::cuda {

namespace {
void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw DeviceError(std::string("CUDA ") + what + " failed: " + cudaGetErrorString(err));
  }
}
cudaStream_t as_stream(StreamId s) { return reinterpret_cast<cudaStream_t>(s); }

void copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, StreamId stream,
          const char* what) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, kind, as_stream(stream)), what);
  check(cudaStreamSynchronize(as_stream(stream)), what);
}
}  // namespace

void set_device(int device) { check(cudaSetDevice(device), "cudaSetDevice"); }

void copy_host_to_device(void* dst, const void* src, std::size_t bytes, StreamId stream) {
  copy(dst, src, bytes, cudaMemcpyHostToDevice, stream, "host-to-device copy");
}

void copy_device_to_host(void* dst, const void* src, std::size_t bytes, StreamId stream) {
  copy(dst, src, bytes, cudaMemcpyDeviceToHost, stream, "device-to-host copy");
}

void copy_device_to_device(void* dst, const void* src, std::size_t bytes, StreamId stream) {
  copy(dst, src, bytes, cudaMemcpyDeviceToDevice, stream, "device-to-device copy");
}

void memset_async(void* dst, int value, std::size_t bytes, StreamId stream) {
  if (bytes == 0) return;
  check(cudaMemsetAsync(dst, value, bytes, as_stream(stream)), "cudaMemsetAsync");
}

void synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

}  // namespace remat::cuda
