// Host-side helpers of cuda/ (internal to cuda/): CUDA runtime errors as
// DeviceError, and the engine's opaque stream ids as cudaStream_t.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "engine/error.h"
#include "engine/memory_backend.h"

namespace remat::cuda::detail {

inline cudaStream_t as_stream(StreamId s) { return reinterpret_cast<cudaStream_t>(s); }

// Throws DeviceError naming the call if a CUDA runtime call failed (and
// clears the sticky last error, so the next call starts clean).
inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw DeviceError(std::string("CUDA ") + what + " failed: " + cudaGetErrorString(err));
  }
}

}  // namespace remat::cuda::detail
