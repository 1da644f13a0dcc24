// The dropout kernel in a build without CUDA: it says why it cannot run.
#include "cuda/dropout.h"
#include "cuda/no_cuda.h"

namespace remat::cuda {

void dropout(void*, const void*, const Strided&, DType, std::uint64_t, std::uint64_t, std::uint32_t,
             float, StreamId) {
  unavailable("cuda::dropout");
}

}  // namespace remat::cuda
