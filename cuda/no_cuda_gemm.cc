// gemm.h in a build without CUDA.
#include "cuda/gemm.h"
#include "cuda/no_cuda.h"

namespace remat::cuda {

std::size_t gemm_workspace_bytes() { return 0; }
void gemm(const GemmArgs&, void*, std::size_t, StreamId) { unavailable("gemm"); }
std::size_t gemm_cached_algorithms() { return 0; }

}  // namespace remat::cuda
