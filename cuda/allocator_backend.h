// The CUDA side of the caching allocator and the device queries the engine
// needs. Plain functions; in a build without the CUDA toolkit they report no
// devices and refuse to make a backend.
#pragma once

#include <memory>

#include "engine/memory_backend.h"

namespace remat::cuda {

// Number of usable CUDA devices; 0 when the build has no CUDA, no driver is
// loaded, or no GPU is present. Never throws.
int device_count();

// True if this binary was compiled with the CUDA back end.
bool built_with_cuda();

// A MemoryBackend over cudaMalloc/cudaFree and CUDA events for `device`.
// Throws DeviceError if the device is not present or CUDA is not built in.
std::unique_ptr<MemoryBackend> make_allocator_backend(int device);

}  // namespace remat::cuda
