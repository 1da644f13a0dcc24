// Philox fills on the GPU: thread i computes block i of the stream, so the
// output equals the CPU generator's for the same (seed, offset).
#include <cuda_runtime.h>

#include "cuda/runtime.h"
#include "engine/error.h"
#include "engine/meta_mirror.h"
#include "engine/philox.h"

namespace remat::cuda {

namespace {

__global__ void uniform_kernel(float* out, std::int64_t n, std::uint64_t seed,
                               std::uint64_t offset) {
  const std::int64_t block = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t first = block * 4;
  if (first >= n) return;
  const auto w = philox::block(seed, offset + std::uint64_t(block));
  for (int j = 0; j < 4 && first + j < n; ++j) out[first + j] = philox::to_uniform(w.v[j]);
}

__global__ void normal_kernel(float* out, std::int64_t n, std::uint64_t seed,
                              std::uint64_t offset) {
  const std::int64_t block = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t first = block * 4;
  if (first >= n) return;
  const auto z = philox::normals(philox::block(seed, offset + std::uint64_t(block)));
  for (int j = 0; j < 4 && first + j < n; ++j) out[first + j] = z[j];
}

void check_launch(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw DeviceError(std::string("CUDA kernel ") + what + " failed: " + cudaGetErrorString(err));
}

}  // namespace

void philox_uniform(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset,
                    StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  if (n <= 0) return;
  const std::int64_t blocks = (n + 3) / 4;
  const int threads = 256;
  uniform_kernel<<<unsigned((blocks + threads - 1) / threads), threads, 0,
                   reinterpret_cast<cudaStream_t>(stream)>>>(out, n, seed, offset);
  check_launch("philox_uniform");
}

void philox_normal(float* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset,
                   StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  if (n <= 0) return;
  const std::int64_t blocks = (n + 3) / 4;
  const int threads = 256;
  normal_kernel<<<unsigned((blocks + threads - 1) / threads), threads, 0,
                  reinterpret_cast<cudaStream_t>(stream)>>>(out, n, seed, offset);
  check_launch("philox_normal");
}

}  // namespace remat::cuda
