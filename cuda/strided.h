// The layout CUDA kernels take: the engine's DeviceLayout (engine/device_layout.h)
// under the name the kernels use.
#pragma once

#include "engine/device_layout.h"

namespace remat::cuda {

using Strided = DeviceLayout;
inline constexpr int kMaxDims = kMaxDeviceDims;

}  // namespace remat::cuda
