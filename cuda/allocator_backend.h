// The CUDA side of the caching allocator and the device count (offered to the
// engine through cuda/backend.cc).
#pragma once

#include <memory>

#include "engine/memory_backend.h"

namespace remat::cuda {

// Number of usable CUDA devices; 0 when no driver is loaded or no GPU is
// present. Never throws.
int device_count();

// A MemoryBackend over cudaMalloc/cudaFree and CUDA events for `device`.
// Throws DeviceError if the device is not present.
std::unique_ptr<MemoryBackend> make_allocator_backend(int device);

}  // namespace remat::cuda
