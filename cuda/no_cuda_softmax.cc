// softmax.h in a build without CUDA.
#include "cuda/no_cuda.h"
#include "cuda/softmax.h"

namespace remat::cuda {

void softmax_forward(void*, const void*, DType, std::int64_t, std::int64_t, bool, StreamId) {
  unavailable("softmax_forward");
}
void softmax_backward(void*, const void*, const void*, DType, std::int64_t, std::int64_t, bool, StreamId) {
  unavailable("softmax_backward");
}
void cross_entropy_forward(float*, float*, const void*, DType, const void*, DType, std::int64_t, std::int64_t,
                           std::int64_t, std::int64_t, float*, StreamId) {
  unavailable("cross_entropy_forward");
}
void cross_entropy_backward(void*, const float*, const void*, const float*, DType, const void*, DType,
                            std::int64_t, std::int64_t, std::int64_t, std::int64_t, StreamId) {
  unavailable("cross_entropy_backward");
}

}  // namespace remat::cuda
