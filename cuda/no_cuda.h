// For the no_cuda*.cc fallbacks (a build without the CUDA toolkit): every
// device function of such a build throws through this.
#pragma once

namespace remat::cuda {

// Throws DeviceError: "<what>: remat was built without CUDA ...".
[[noreturn]] void unavailable(const char* what);

}  // namespace remat::cuda
