// The seam between the engine and a device back end: everything the engine
// itself runs on a CUDA device goes through this interface (device discovery
// and the current device, raw memory through MemoryBackend, copies and fills,
// gradient accumulation and the sum that undoes broadcasting, the Philox
// fills, streams, events and syncs). cuda/ implements it and registers the
// implementation when //cuda is linked in (cuda/backend.cc). With none
// registered there are no CUDA devices: every request for one throws
// DeviceError "no CUDA device". The engine never includes a device API or a
// cuda/ header; cuda/ registers its op kernels in ops/' kernel tables
// (engine < ops < cuda).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "engine/device.h"
#include "engine/device_layout.h"
#include "engine/device_runtime.h"
#include "engine/dtype.h"
#include "engine/memory_backend.h"

namespace remat {

// Device ordinals are the `index` of cuda_device(index). Unless a function
// says otherwise, work is queued on `stream` and the call returns without
// waiting; each throws DeviceError naming the failing device call.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  // ---- Discovery and the current device
  // Usable devices (0 when no driver or GPU is present). Never throws.
  virtual int device_count() = 0;
  virtual DeviceInfo device_info(int device) = 0;
  // The calling thread's current device, and making `device` current.
  virtual int current_device() = 0;
  virtual void set_device(int device) = 0;
  // The raw memory of `device` for its caching allocator.
  virtual std::unique_ptr<MemoryBackend> make_memory_backend(int device) = 0;

  // ---- Copies and fills
  // `bytes` between pageable host memory and the device, complete on return.
  virtual void copy_host_to_device(void* dst, const void* src, std::size_t bytes, StreamId stream) = 0;
  virtual void copy_device_to_host(void* dst, const void* src, std::size_t bytes, StreamId stream) = 0;
  // `bytes` between device memory and pinned host memory (either way, or
  // device to device), queued on `stream`: returns without waiting.
  virtual void copy_async(void* dst, const void* src, std::size_t bytes, StreamId stream) = 0;
  // Page-locked host memory for copy_async (nullptr when none is left), and
  // its release.
  virtual void* host_alloc_pinned(std::size_t bytes) = 0;
  virtual void host_free_pinned(void* ptr) = 0;
  // Sets `bytes` bytes at dst to `value`.
  virtual void memset(void* dst, int value, std::size_t bytes, StreamId stream) = 0;
  // dst[dst_l] = convert(src[src_l]) element by element (same sizes), with
  // the CPU's conversions (round to nearest even, truncation to integers,
  // != 0 for bool, saturating fp8).
  virtual void copy_strided(void* dst, DType dst_dtype, const DeviceLayout& dst_l, const void* src,
                            DType src_dtype, const DeviceLayout& src_l, StreamId stream) = 0;
  // n contiguous elements of `dtype` at dst set to `value`, converted as a
  // CPU fill converts it.
  virtual void fill(void* dst, DType dtype, std::int64_t n, double value, StreamId stream) = 0;

  // ---- Gradient arithmetic (deterministic: fixed orders, no atomics)
  // dst += src over layouts of the same sizes, in f32, rounded to dst's
  // dtype (a src of another dtype is first rounded to dst's). Floating only.
  virtual void add_into(void* dst, DType dst_dtype, const DeviceLayout& dst_l, const void* src,
                        DType src_dtype, const DeviceLayout& src_l, StreamId stream) = 0;
  // out[o] (f32, contiguous, kept.numel()) = the sum over the `reduced`
  // elements of in that map to o, in increasing order in f32 (the CPU's
  // sum_to_shape order); workspace holds sum_reduced_workspace floats.
  virtual void sum_reduced(float* out, const void* in, DType in_dtype, const DeviceLayout& kept,
                           const DeviceLayout& reduced, float* workspace, StreamId stream) = 0;
  virtual std::int64_t sum_reduced_workspace(const DeviceLayout& kept, const DeviceLayout& reduced) = 0;

  // ---- Random numbers
  // out[0..n) from the Philox stream (seed, offset), exactly as the CPU
  // generator fills it (engine/philox.h): uniform in [0, 1) or standard normal.
  virtual void philox_uniform(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset,
                              StreamId stream) = 0;
  virtual void philox_normal(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset,
                             StreamId stream) = 0;

  // ---- Synchronisation, streams and events
  // Blocks until all work on the current device is done.
  virtual void synchronize() = 0;
  // A non-blocking stream on the current device, and its release.
  virtual StreamId create_stream() = 0;
  virtual void destroy_stream(StreamId stream) = 0;
  // Blocks until all work queued on `stream` is done.
  virtual void synchronize_stream(StreamId stream) = 0;
  // An event with timing enabled, and its release.
  virtual EventId create_event() = 0;
  virtual void destroy_event(EventId event) = 0;
  // Captures the work queued on `stream` so far.
  virtual void record_event(EventId event, StreamId stream) = 0;
  // Later work on `stream` waits for `event` (the host does not block).
  virtual void wait_event(EventId event, StreamId stream) = 0;
  // Blocks the host until `event` completes.
  virtual void synchronize_event(EventId event) = 0;
  // True once `event` has completed (or was never recorded); never blocks.
  virtual bool query_event(EventId event) = 0;
  // Milliseconds between two recorded, completed events.
  virtual float elapsed_ms(EventId start, EventId end) = 0;
};

// Installs `backend` as the CUDA back end. It must live as long as the
// process (cuda/ registers an immortal object during static initialisation);
// a second registration throws Error.
void register_cuda_backend(DeviceBackend& backend);

namespace detail {
// The registered CUDA back end, or nullptr.
DeviceBackend* cuda_backend_or_null();
// The registered CUDA back end; throws DeviceError "<what> on <device>: no
// CUDA device ..." when there is none.
DeviceBackend& cuda_backend(const char* what, Device device);
}  // namespace detail

}  // namespace remat
