// The CUDA seam in a build without the CUDA toolkit: no devices, and every
// device operation says why it cannot run.
#include "cuda/allocator_backend.h"
#include "cuda/copy.h"
#include "cuda/no_cuda.h"
#include "cuda/runtime.h"
#include "cuda/stream.h"
#include "engine/error.h"

namespace remat::cuda {

void unavailable(const char* what) {
  throw DeviceError(std::string(what) + ": remat was built without CUDA (no toolkit found at " +
                    "build time; set REMAT_CUDA_PATH or install it in /usr/local/cuda)");
}

int device_count() { return 0; }
bool built_with_cuda() { return false; }
std::unique_ptr<MemoryBackend> make_allocator_backend(int) { unavailable("CUDA allocator"); }
DeviceInfo device_info(int) { unavailable("device_info"); }
void set_device(int) { unavailable("set_device"); }
void copy_host_to_device(void*, const void*, std::size_t, StreamId) { unavailable("copy"); }
void copy_device_to_host(void*, const void*, std::size_t, StreamId) { unavailable("copy"); }
void copy_device_to_device(void*, const void*, std::size_t, StreamId) { unavailable("copy"); }
void memset_async(void*, int, std::size_t, StreamId) { unavailable("memset"); }
void synchronize() { unavailable("synchronize"); }
void philox_uniform(float*, std::int64_t, std::uint64_t, std::uint64_t, StreamId) {
  unavailable("philox_uniform");
}
void philox_normal(float*, std::int64_t, std::uint64_t, std::uint64_t, StreamId) {
  unavailable("philox_normal");
}


StreamId current_stream() { return 0; }
StreamGuard::StreamGuard(StreamId stream) : previous_(stream) {}
StreamGuard::~StreamGuard() = default;
Stream::Stream() { unavailable("Stream"); }
Stream::~Stream() = default;
void Stream::synchronize() const {}
Event::Event() { unavailable("Event"); }
Event::~Event() = default;
void Event::record(StreamId) {}
void Event::wait(StreamId) const {}
void Event::synchronize() const {}
float Event::elapsed_ms(const Event&) const { return 0; }

void copy_strided(void*, DType, const Strided&, const void*, DType, const Strided&, StreamId) {
  unavailable("copy_strided");
}
void fill(void*, DType, std::int64_t, double, StreamId) { unavailable("fill"); }

}  // namespace remat::cuda
