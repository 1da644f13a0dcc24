#include "cuda/kernel_profiler.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <map>

#include "cuda/check.h"
#include "engine/autograd.h"
#include "engine/device_runtime.h"
#include "engine/recompute_context.h"

namespace remat::cuda {

using detail::as_stream;
using detail::check_cuda;

namespace {
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }
}  // namespace

CudaKernelProfiler::CudaKernelProfiler() = default;

CudaKernelProfiler::~CudaKernelProfiler() {
  for (const Record& r : records_) {
    cudaEventDestroy(as_event(r.begin));
    if (r.end) cudaEventDestroy(as_event(r.end));
  }
  for (void* e : pool_) cudaEventDestroy(as_event(e));
}

void* CudaKernelProfiler::event() {
  if (!pool_.empty()) {
    void* e = pool_.back();
    pool_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  check_cuda(cudaEventCreate(&e), "cudaEventCreate (kernel profile)");
  return e;
}

void CudaKernelProfiler::begin(const char* table, Device device) {
  if (!device.is_cuda()) return;
  Record r;
  // (Kernels run under no-grad; the phase is the autograd engine's.)
  r.key = std::string(table) + (in_recompute()                            ? " replay"
                                : backward_mode() != BackwardMode::none ? " backward"
                                                                        : " forward");
  r.begin = event();
  r.parent = open_.empty() ? -1 : open_.back();
  check_cuda(cudaEventRecord(as_event(r.begin), as_stream(current_stream())), "cudaEventRecord (kernel profile)");
  open_.push_back(std::int64_t(records_.size()));
  records_.push_back(std::move(r));
}

void CudaKernelProfiler::end(const char* /*table*/, Device device) {
  if (!device.is_cuda() || open_.empty()) return;
  Record& r = records_[std::size_t(open_.back())];
  open_.pop_back();
  r.end = event();
  check_cuda(cudaEventRecord(as_event(r.end), as_stream(current_stream())), "cudaEventRecord (kernel profile)");
}

std::vector<KernelTime> CudaKernelProfiler::collect() {
  std::vector<double> inclusive(records_.size(), 0.0), children(records_.size(), 0.0);
  for (std::size_t i = 0; i < records_.size(); ++i) {
    const Record& r = records_[i];
    if (!r.end) continue;  // still open (collect() inside a kernel): not counted
    check_cuda(cudaEventSynchronize(as_event(r.end)), "cudaEventSynchronize (kernel profile)");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, as_event(r.begin), as_event(r.end)), "cudaEventElapsedTime (kernel profile)");
    inclusive[i] = ms;
    if (r.parent >= 0) children[std::size_t(r.parent)] += ms;
  }
  std::map<std::string, KernelTime> by;
  for (std::size_t i = 0; i < records_.size(); ++i) {
    if (!records_[i].end) continue;
    KernelTime& k = by[records_[i].key];
    k.table = records_[i].key;
    ++k.calls;
    k.ms += inclusive[i] - children[i];
  }
  for (const Record& r : records_) {
    pool_.push_back(r.begin);
    if (r.end) pool_.push_back(r.end);
  }
  records_.clear();
  open_.clear();
  std::vector<KernelTime> out;
  for (auto& [key, k] : by) out.push_back(std::move(k));
  std::sort(out.begin(), out.end(), [](const KernelTime& a, const KernelTime& b) { return a.ms > b.ms; });
  return out;
}

}  // namespace remat::cuda
