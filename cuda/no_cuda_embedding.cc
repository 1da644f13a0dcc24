// cuda/embedding.h in a build without the CUDA toolkit: every function says so.
#include "cuda/embedding.h"
#include "cuda/no_cuda.h"

namespace remat::cuda {

void embedding_forward(void*, const void*, DType, const void*, DType, std::int64_t, std::int64_t, StreamId) {
  unavailable("embedding_forward");
}
void embedding_backward(void*, const void*, DType, const std::int64_t*, const std::int64_t*,
                        const std::int64_t*, std::int64_t, std::int64_t, StreamId) {
  unavailable("embedding_backward");
}

}  // namespace remat::cuda
