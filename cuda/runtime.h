// Thin wrappers over the CUDA runtime for device queries, copies, fills and
// synchronisation; cuda/backend.cc offers them to the engine as its device
// back end. Every function throws DeviceError naming the CUDA error on failure.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/device_runtime.h"
#include "engine/memory_backend.h"

namespace remat::cuda {

// Properties of CUDA device `device`; throws DeviceError if it is absent.
DeviceInfo device_info(int device);

// The calling thread's current device.
int current_device();
// Makes `device` current on the calling thread.
void set_device(int device);
// Host-to-device, device-to-host and device-to-device copies of `bytes`
// (pageable host memory; large copies are staged through pinned buffers),
// ordered on `stream` and complete when the function returns.
void copy_host_to_device(void* dst, const void* src, std::size_t bytes, StreamId stream = 0);
void copy_device_to_host(void* dst, const void* src, std::size_t bytes, StreamId stream = 0);
void copy_device_to_device(void* dst, const void* src, std::size_t bytes, StreamId stream = 0);
// Sets `bytes` bytes at dst to `value`, ordered on `stream`.
void memset_async(void* dst, int value, std::size_t bytes, StreamId stream = 0);
// Waits for all work on the current device.
void synchronize();

// Fills out[0..n) with the Philox stream (seed, offset) exactly as the CPU
// generator does (see engine/philox.h): uniform in [0, 1) or standard normal.
void philox_uniform(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset,
                    StreamId stream = 0);
void philox_normal(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset,
                   StreamId stream = 0);

}  // namespace remat::cuda
