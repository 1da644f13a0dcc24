// The CUDA device back end: the engine's DeviceBackend (engine/device_backend.h)
// over the CUDA runtime and the kernels of accumulate.h, copy.h and philox.cu,
// registered during static initialisation. //cuda is linked whole
// (alwayslink), so any binary that depends on it has the back end; one that
// does not (or a build without the toolkit) has no CUDA devices.
#include <cuda_runtime.h>

#include <memory>

#include "cuda/accumulate.h"
#include "cuda/allocator_backend.h"
#include "cuda/copy.h"
#include "cuda/runtime.h"
#include "engine/device_backend.h"
#include "cuda/check.h"
#include "engine/error.h"
#include "engine/immortal.h"

namespace remat::cuda {

namespace {

using detail::as_stream;
using detail::check_cuda;
cudaEvent_t as_event(EventId e) { return reinterpret_cast<cudaEvent_t>(e); }

class CudaBackend final : public DeviceBackend {
 public:
  int device_count() override { return cuda::device_count(); }
  DeviceInfo device_info(int device) override { return cuda::device_info(device); }
  int current_device() override { return cuda::current_device(); }
  void set_device(int device) override { cuda::set_device(device); }
  std::unique_ptr<MemoryBackend> make_memory_backend(int device) override {
    return make_allocator_backend(device);
  }

  void copy_host_to_device(void* dst, const void* src, std::size_t bytes, StreamId stream) override {
    cuda::copy_host_to_device(dst, src, bytes, stream);
  }
  void copy_device_to_host(void* dst, const void* src, std::size_t bytes, StreamId stream) override {
    cuda::copy_device_to_host(dst, src, bytes, stream);
  }
  void copy_async(void* dst, const void* src, std::size_t bytes, StreamId stream) override {
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream)), "cudaMemcpyAsync");
  }
  void* host_alloc_pinned(std::size_t bytes) override {
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return nullptr;
    }
    check_cuda(err, "cudaHostAlloc");
    return p;
  }
  void host_free_pinned(void* ptr) override { cudaFreeHost(ptr); }
  void memset(void* dst, int value, std::size_t bytes, StreamId stream) override {
    memset_async(dst, value, bytes, stream);
  }
  void copy_strided(void* dst, DType dst_dtype, const DeviceLayout& dst_l, const void* src, DType src_dtype,
                    const DeviceLayout& src_l, StreamId stream) override {
    cuda::copy_strided(dst, dst_dtype, dst_l, src, src_dtype, src_l, stream);
  }
  void fill(void* dst, DType dtype, std::int64_t n, double value, StreamId stream) override {
    cuda::fill(dst, dtype, n, value, stream);
  }

  void add_into(void* dst, DType dst_dtype, const DeviceLayout& dst_l, const void* src, DType src_dtype,
                const DeviceLayout& src_l, StreamId stream) override {
    cuda::add_into(dst, dst_dtype, dst_l, src, src_dtype, src_l, stream);
  }
  void sum_reduced(float* out, const void* in, DType in_dtype, const DeviceLayout& kept, const DeviceLayout& reduced,
                   float* workspace, StreamId stream) override {
    cuda::sum_reduced(out, in, in_dtype, kept, reduced, workspace, stream);
  }
  std::int64_t sum_reduced_workspace(const DeviceLayout& kept, const DeviceLayout& reduced) override {
    return cuda::sum_reduced_workspace(kept, reduced);
  }

  void philox_uniform(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset,
                      StreamId stream) override {
    cuda::philox_uniform(out, n, seed, offset, stream);
  }
  void philox_normal(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset,
                     StreamId stream) override {
    cuda::philox_normal(out, n, seed, offset, stream);
  }

  void synchronize() override { cuda::synchronize(); }
  StreamId create_stream() override {
    cudaStream_t s = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    return reinterpret_cast<StreamId>(s);
  }
  void destroy_stream(StreamId stream) override { cudaStreamDestroy(as_stream(stream)); }
  void synchronize_stream(StreamId stream) override {
    check_cuda(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize");
  }
  EventId create_event() override {
    cudaEvent_t e = nullptr;
    check_cuda(cudaEventCreate(&e), "cudaEventCreate");
    return reinterpret_cast<EventId>(e);
  }
  void destroy_event(EventId event) override { cudaEventDestroy(as_event(event)); }
  void record_event(EventId event, StreamId stream) override {
    check_cuda(cudaEventRecord(as_event(event), as_stream(stream)), "cudaEventRecord");
  }
  void wait_event(EventId event, StreamId stream) override {
    check_cuda(cudaStreamWaitEvent(as_stream(stream), as_event(event), 0), "cudaStreamWaitEvent");
  }
  void synchronize_event(EventId event) override { check_cuda(cudaEventSynchronize(as_event(event)), "cudaEventSynchronize"); }
  bool query_event(EventId event) override {
    const cudaError_t err = cudaEventQuery(as_event(event));
    if (err == cudaErrorNotReady) return false;
    check_cuda(err, "cudaEventQuery");
    return true;
  }
  float elapsed_ms(EventId start, EventId end) override {
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, as_event(start), as_event(end)), "cudaEventElapsedTime");
    return ms;
  }
};

// Never destroyed: kernels and frees may still run during CUDA teardown.
[[maybe_unused]] const bool registered = [] {
  static remat::detail::Immortal<CudaBackend> backend;
  register_cuda_backend(backend.get());
  return true;
}();

}  // namespace

}  // namespace remat::cuda
