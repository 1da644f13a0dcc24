// The registered device back end and the device functions code above the
// engine calls (engine/device_runtime.h).
#include "engine/device_runtime.h"

#include <atomic>
#include <utility>

#include "engine/device_backend.h"
#include "engine/meta_mirror.h"
#include "engine/error.h"

namespace remat {

namespace {
std::atomic<DeviceBackend*> g_cuda_backend{nullptr};
thread_local StreamId tls_stream = 0;

// The back end, after checking `device` is one of its devices.
DeviceBackend& present(const char* what, Device device) {
  DeviceBackend& b = detail::cuda_backend(what, device);
  const int n = b.device_count();
  REMAT_CHECK(device.index >= 0 && device.index < n, DeviceError, what, ": device ", device,
              " is not available (", n, " CUDA devices present)");
  return b;
}
}  // namespace

void register_cuda_backend(DeviceBackend& backend) {
  DeviceBackend* none = nullptr;
  REMAT_CHECK(g_cuda_backend.compare_exchange_strong(none, &backend), Error,
              "register_cuda_backend: a CUDA back end is already registered");
}

DeviceBackend* detail::cuda_backend_or_null() { return g_cuda_backend.load(std::memory_order_acquire); }

DeviceBackend& detail::cuda_backend(const char* what, Device device) {
  DeviceBackend* b = cuda_backend_or_null();
  REMAT_CHECK(b != nullptr, DeviceError, what, " on ", device,
              ": no CUDA device: this build of remat has no CUDA back end (no toolkit was found at "
              "build time; set REMAT_CUDA_PATH or install one in /usr/local/cuda)");
  return *b;
}

bool cuda_built() { return detail::cuda_backend_or_null() != nullptr; }

int cuda_device_count() {
  DeviceBackend* b = detail::cuda_backend_or_null();
  return b ? b->device_count() : 0;
}

DeviceInfo device_info(Device device) {
  REMAT_CHECK(device.is_cuda(), DeviceError, "device_info: ", device, " is not a CUDA device");
  return present("device_info", device).device_info(device.index);
}

void set_current_device(Device device) {
  if (!device.is_cuda()) return;
  present("set_current_device", device).set_device(device.index);
}

void use_device_if_present(Device device) {
  if (device.is_cuda() && device.index < cuda_device_count()) set_current_device(device);
}

void synchronize(Device device) {
  if (!device.is_cuda()) return;  // the CPU's and meta's work is done when queued
  DeviceBackend& b = present("synchronize", device);
  const int previous = b.current_device();
  if (previous == device.index) return b.synchronize();
  b.set_device(device.index);
  b.synchronize();
  b.set_device(previous);
}

StreamId current_stream() { return tls_stream; }

StreamGuard::StreamGuard(StreamId stream) : previous_(tls_stream) { tls_stream = stream; }
StreamGuard::~StreamGuard() { tls_stream = previous_; }

Stream::Stream() : id_(detail::cuda_backend("Stream", cuda_device()).create_stream()) {}
Stream::~Stream() {
  if (id_) detail::cuda_backend_or_null()->destroy_stream(id_);
}
void Stream::synchronize() const { detail::cuda_backend("Stream", cuda_device()).synchronize_stream(id_); }

Event::Event() : id_(detail::cuda_backend("Event", cuda_device()).create_event()) {}
Event::~Event() {
  if (id_) detail::cuda_backend_or_null()->destroy_event(id_);
}
void Event::record(StreamId stream) { detail::cuda_backend("Event", cuda_device()).record_event(id_, stream); }
void Event::wait(StreamId stream) const { detail::cuda_backend("Event", cuda_device()).wait_event(id_, stream); }
void Event::synchronize() const { detail::cuda_backend("Event", cuda_device()).synchronize_event(id_); }
bool Event::query() const { return detail::cuda_backend("Event", cuda_device()).query_event(id_); }
float Event::elapsed_ms(const Event& later) const {
  return detail::cuda_backend("Event", cuda_device()).elapsed_ms(id_, later.id_);
}

PinnedBuffer::PinnedBuffer(std::size_t bytes) {
  if (bytes == 0) return;
  data_ = detail::cuda_backend("PinnedBuffer", cuda_device()).host_alloc_pinned(bytes);
  REMAT_CHECK(data_ != nullptr, DeviceError, "PinnedBuffer: cannot allocate ", bytes, " bytes of pinned host memory");
  size_ = bytes;
}
PinnedBuffer::~PinnedBuffer() {
  if (data_) detail::cuda_backend_or_null()->host_free_pinned(data_);
}
PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) detail::cuda_backend_or_null()->host_free_pinned(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void copy_async(void* dst, const void* src, std::size_t bytes, StreamId stream) {
  if (bytes == 0) return;
  detail::cuda_backend("copy_async", cuda_device()).copy_async(dst, src, bytes, stream);
}

// ---------------------------------------------------------------------------
// What a meta run mirrors (engine/meta_mirror.h)

namespace {
// Set by a command line (mem --meta-kernels) or a test's scope; read by every
// meta kernel call.
std::atomic<DeviceType> g_meta_kernels{DeviceType::CPU};
}  // namespace

void set_meta_kernels(DeviceType t) {
  REMAT_CHECK(t == DeviceType::CPU || t == DeviceType::CUDA, DeviceError, "meta kernels: ", device_type_name(t),
              ": meta mirrors the kernels of cpu or cuda");
  REMAT_CHECK(t != DeviceType::CUDA || cuda_built(), DeviceError,
              "meta kernels: this build has no CUDA back end (built without the CUDA toolkit): meta can mirror "
              "only the CPU's kernels");
  g_meta_kernels.store(t);
}

DeviceType meta_kernels() { return g_meta_kernels.load(std::memory_order_relaxed); }

bool runs_cuda_kernels(Device d) { return d.is_cuda() || (d.is_meta() && meta_kernels() == DeviceType::CUDA); }

MetaKernelsScope::MetaKernelsScope(DeviceType t) : previous_(meta_kernels()) { set_meta_kernels(t); }
MetaKernelsScope::~MetaKernelsScope() { g_meta_kernels.store(previous_); }

}  // namespace remat
