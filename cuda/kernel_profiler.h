// The GPU time of every kernel table's kernels and of the engine's own device
// work (engine/op_hooks.h's KernelObserver over CUDA events): where a step's
// device time goes, by op family, forward, backward and replay apart. Events are recorded on the calling
// thread's stream around each kernel call; collect() waits for them. A
// profile adds two event records a kernel call, so its step is a little
// slower than an unprofiled one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/op_hooks.h"

namespace remat::cuda {

// One kernel table's share of the profiled work.
struct KernelTime {
  // The kernel table's (or the engine's work's) name, then " forward",
  // " backward" (inside autograd's backward) or " replay" (a checkpoint's
  // recompute); the optimizer counts as forward.
  std::string table;
  std::int64_t calls = 0;
  double ms = 0;           // its kernels' GPU time, less that of the tables its kernels called
};

class CudaKernelProfiler final : public KernelObserver {
 public:
  CudaKernelProfiler();
  ~CudaKernelProfiler() override;
  CudaKernelProfiler(const CudaKernelProfiler&) = delete;
  CudaKernelProfiler& operator=(const CudaKernelProfiler&) = delete;

  void begin(const char* table, Device device) override;
  void end(const char* table, Device device) override;

  // Waits for the recorded work and returns the time per table since the
  // last collect(), most first; starts a fresh profile. Throws DeviceError on
  // a CUDA failure.
  std::vector<KernelTime> collect();

 private:
  struct Record {
    std::string key;
    void* begin = nullptr;  // cudaEvent_t
    void* end = nullptr;
    std::int64_t parent = -1;
  };
  void* event();
  std::vector<Record> records_;
  std::vector<std::int64_t> open_;  // indices into records_ of kernels not yet returned
  std::vector<void*> pool_;         // events of collected records, for reuse
};

}  // namespace remat::cuda
