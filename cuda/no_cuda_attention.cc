// attention.h in a build without CUDA.
#include "cuda/attention.h"
#include "cuda/no_cuda.h"

namespace remat::cuda {

void attention_forward(const void*, const void*, const void*, void*, float*, std::int64_t,
                       std::int64_t, std::int64_t, bool, float, DType, StreamId) {
  unavailable("attention_forward");
}
void attention_backward(const void*, const void*, const void*, const void*, const void*,
                        const float*, void*, void*, void*, float*, std::int64_t, std::int64_t,
                        std::int64_t, bool, float, DType, StreamId) {
  unavailable("attention_backward");
}

}  // namespace remat::cuda
