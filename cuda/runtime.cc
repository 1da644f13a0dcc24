#include "cuda/runtime.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "engine/error.h"
#include "engine/immortal.h"

namespace remat::cuda {

namespace {
void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw DeviceError(std::string("CUDA ") + what + " failed: " + cudaGetErrorString(err));
  }
}
cudaStream_t as_stream(StreamId s) { return reinterpret_cast<cudaStream_t>(s); }

// Host<->device copies of pageable memory go through two pinned buffers:
// while the DMA engine moves one chunk, the host fills (or drains) the other.
// Small copies go direct. One staging area per process, behind a lock.
constexpr std::size_t kStageBytes = 8 << 20;
constexpr std::size_t kDirectBytes = 256 << 10;

class PinnedStaging {
 public:
  void to_device(char* dst, const char* src, std::size_t bytes, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    ensure();
    int slot = 0;
    for (std::size_t off = 0; off < bytes; off += kStageBytes, slot ^= 1) {
      const std::size_t n = std::min(kStageBytes, bytes - off);
      check(cudaEventSynchronize(done_[slot]), "host-to-device copy (staging wait)");
      std::memcpy(buf_[slot], src + off, n);
      check(cudaMemcpyAsync(dst + off, buf_[slot], n, cudaMemcpyHostToDevice, stream), "host-to-device copy");
      check(cudaEventRecord(done_[slot], stream), "host-to-device copy (event)");
    }
    check(cudaStreamSynchronize(stream), "host-to-device copy");
  }

  void to_host(char* dst, const char* src, std::size_t bytes, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    ensure();
    // Queue chunk k+1 before draining chunk k.
    const std::size_t chunks = (bytes + kStageBytes - 1) / kStageBytes;
    auto issue = [&](std::size_t c) {
      const std::size_t off = c * kStageBytes, n = std::min(kStageBytes, bytes - off);
      check(cudaMemcpyAsync(buf_[c & 1], src + off, n, cudaMemcpyDeviceToHost, stream), "device-to-host copy");
      check(cudaEventRecord(done_[c & 1], stream), "device-to-host copy (event)");
    };
    issue(0);
    for (std::size_t c = 0; c < chunks; ++c) {
      if (c + 1 < chunks) issue(c + 1);
      check(cudaEventSynchronize(done_[c & 1]), "device-to-host copy");
      const std::size_t off = c * kStageBytes, n = std::min(kStageBytes, bytes - off);
      std::memcpy(dst + off, buf_[c & 1], n);
    }
  }

 private:
  void ensure() {
    if (buf_[0]) return;
    for (int i = 0; i < 2; ++i) {
      check(cudaMallocHost(&buf_[i], kStageBytes), "cudaMallocHost (pinned staging)");
      check(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming), "cudaEventCreate");
    }
  }

  std::mutex mu_;
  void* buf_[2] = {nullptr, nullptr};
  cudaEvent_t done_[2] = {nullptr, nullptr};
};

PinnedStaging& staging() {
  static remat::detail::Immortal<PinnedStaging> s;  // never destroyed: outlives CUDA teardown
  return s.get();
}

void direct(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, StreamId stream,
            const char* what) {
  check(cudaMemcpyAsync(dst, src, bytes, kind, as_stream(stream)), what);
  check(cudaStreamSynchronize(as_stream(stream)), what);
}
}  // namespace

DeviceInfo device_info(int device) {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  DeviceInfo info;
  info.name = prop.name;
  info.major = prop.major;
  info.minor = prop.minor;
  info.multiprocessors = prop.multiProcessorCount;
  check(cudaDeviceGetAttribute(&info.clock_khz, cudaDevAttrClockRate, device), "cudaDeviceGetAttribute(clock)");
  info.memory_bytes = prop.totalGlobalMem;
  return info;
}

int current_device() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

void set_device(int device) { check(cudaSetDevice(device), "cudaSetDevice"); }

void copy_host_to_device(void* dst, const void* src, std::size_t bytes, StreamId stream) {
  if (bytes == 0) return;
  if (bytes <= kDirectBytes) return direct(dst, src, bytes, cudaMemcpyHostToDevice, stream, "host-to-device copy");
  staging().to_device(static_cast<char*>(dst), static_cast<const char*>(src), bytes, as_stream(stream));
}

void copy_device_to_host(void* dst, const void* src, std::size_t bytes, StreamId stream) {
  if (bytes == 0) return;
  if (bytes <= kDirectBytes) return direct(dst, src, bytes, cudaMemcpyDeviceToHost, stream, "device-to-host copy");
  staging().to_host(static_cast<char*>(dst), static_cast<const char*>(src), bytes, as_stream(stream));
}

void copy_device_to_device(void* dst, const void* src, std::size_t bytes, StreamId stream) {
  if (bytes == 0) return;
  direct(dst, src, bytes, cudaMemcpyDeviceToDevice, stream, "device-to-device copy");
}

void memset_async(void* dst, int value, std::size_t bytes, StreamId stream) {
  if (bytes == 0) return;
  check(cudaMemsetAsync(dst, value, bytes, as_stream(stream)), "cudaMemsetAsync");
}

void synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

}  // namespace remat::cuda
