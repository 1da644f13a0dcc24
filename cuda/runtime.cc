#include "cuda/runtime.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "cuda/check.h"
#include "engine/error.h"
#include "engine/immortal.h"
#include "engine/meta_mirror.h"

namespace remat::cuda {

namespace {
using detail::as_stream;
using detail::check_cuda;

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
      check_cuda(cudaEventSynchronize(done_[slot]), "host-to-device copy (staging wait)");
      std::memcpy(buf_[slot], src + off, n);
      check_cuda(cudaMemcpyAsync(dst + off, buf_[slot], n, cudaMemcpyHostToDevice, stream), "host-to-device copy");
      check_cuda(cudaEventRecord(done_[slot], stream), "host-to-device copy (event)");
    }
    check_cuda(cudaStreamSynchronize(stream), "host-to-device copy");
  }

  void to_host(char* dst, const char* src, std::size_t bytes, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    ensure();
    // Queue chunk k+1 before draining chunk k.
    const std::size_t chunks = (bytes + kStageBytes - 1) / kStageBytes;
    auto issue = [&](std::size_t c) {
      const std::size_t off = c * kStageBytes, n = std::min(kStageBytes, bytes - off);
      check_cuda(cudaMemcpyAsync(buf_[c & 1], src + off, n, cudaMemcpyDeviceToHost, stream), "device-to-host copy");
      check_cuda(cudaEventRecord(done_[c & 1], stream), "device-to-host copy (event)");
    };
    issue(0);
    for (std::size_t c = 0; c < chunks; ++c) {
      if (c + 1 < chunks) issue(c + 1);
      check_cuda(cudaEventSynchronize(done_[c & 1]), "device-to-host copy");
      const std::size_t off = c * kStageBytes, n = std::min(kStageBytes, bytes - off);
      std::memcpy(dst + off, buf_[c & 1], n);
    }
  }

 private:
  void ensure() {
    if (buf_[0]) return;
    for (int i = 0; i < 2; ++i) {
      check_cuda(cudaMallocHost(&buf_[i], kStageBytes), "cudaMallocHost (pinned staging)");
      check_cuda(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming), "cudaEventCreate");
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
  check_cuda(cudaMemcpyAsync(dst, src, bytes, kind, as_stream(stream)), what);
  check_cuda(cudaStreamSynchronize(as_stream(stream)), what);
}
}  // namespace

DeviceInfo device_info(int device) {
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  DeviceInfo info;
  info.name = prop.name;
  info.major = prop.major;
  info.minor = prop.minor;
  info.multiprocessors = prop.multiProcessorCount;
  check_cuda(cudaDeviceGetAttribute(&info.clock_khz, cudaDevAttrClockRate, device), "cudaDeviceGetAttribute(clock)");
  info.memory_bytes = prop.totalGlobalMem;
  return info;
}

int current_device() {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

void set_device(int device) { check_cuda(cudaSetDevice(device), "cudaSetDevice"); }

void copy_host_to_device(void* dst, const void* src, std::size_t bytes, StreamId stream) {
  if (bytes == 0 || meta_addresses_active()) return;  // (a meta run of a kernel: engine/meta_mirror.h)
  if (bytes <= kDirectBytes) return direct(dst, src, bytes, cudaMemcpyHostToDevice, stream, "host-to-device copy");
  staging().to_device(static_cast<char*>(dst), static_cast<const char*>(src), bytes, as_stream(stream));
}

void copy_device_to_host(void* dst, const void* src, std::size_t bytes, StreamId stream) {
  if (bytes == 0 || meta_addresses_active()) return;  // (a meta run of a kernel: engine/meta_mirror.h)
  if (bytes <= kDirectBytes) return direct(dst, src, bytes, cudaMemcpyDeviceToHost, stream, "device-to-host copy");
  staging().to_host(static_cast<char*>(dst), static_cast<const char*>(src), bytes, as_stream(stream));
}

void copy_device_to_device(void* dst, const void* src, std::size_t bytes, StreamId stream) {
  if (bytes == 0 || meta_addresses_active()) return;  // (a meta run of a kernel: engine/meta_mirror.h)
  direct(dst, src, bytes, cudaMemcpyDeviceToDevice, stream, "device-to-device copy");
}

void memset_async(void* dst, int value, std::size_t bytes, StreamId stream) {
  if (bytes == 0 || meta_addresses_active()) return;  // (a meta run of a kernel: engine/meta_mirror.h)
  check_cuda(cudaMemsetAsync(dst, value, bytes, as_stream(stream)), "cudaMemsetAsync");
}

void synchronize() { check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

}  // namespace remat::cuda
