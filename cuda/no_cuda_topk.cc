// cuda/topk.h in a build without the CUDA toolkit: every function says so.
#include "cuda/no_cuda.h"
#include "cuda/topk.h"

namespace remat::cuda {

void topk(const void*, DType, const Strided&, std::int64_t, std::int64_t, void*, std::int64_t*,
          const Strided&, std::int64_t, std::int64_t, bool, StreamId) {
  unavailable("topk");
}
void topk_backward(void*, const Strided&, std::int64_t, const void*, const Strided&, std::int64_t,
                   const std::int64_t*, const Strided&, std::int64_t, DType, std::int64_t, StreamId) {
  unavailable("topk_backward");
}

}  // namespace remat::cuda
