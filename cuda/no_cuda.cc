// The CUDA seam in a build without the CUDA toolkit: no devices, and every
// device operation says why it cannot run.
#include "cuda/allocator_backend.h"
#include "cuda/runtime.h"
#include "engine/error.h"

namespace remat::cuda {

namespace {
[[noreturn]] void unavailable(const char* what) {
  throw DeviceError(std::string(what) + ": remat was built without CUDA (no toolkit found at " +
                    "build time; set REMAT_CUDA_PATH or install it in /usr/local/cuda)");
}
}  // namespace

int device_count() { return 0; }
bool built_with_cuda() { return false; }
std::unique_ptr<MemoryBackend> make_allocator_backend(int) { unavailable("CUDA allocator"); }
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

}  // namespace remat::cuda
