// norm.h in a build without CUDA.
#include "cuda/no_cuda.h"
#include "cuda/norm.h"

namespace remat::cuda {

std::int64_t norm_param_grad_workspace(std::int64_t, std::int64_t) { return 0; }
void rms_norm_forward(void*, float*, const void*, const void*, DType, std::int64_t, std::int64_t, float,
                      StreamId) {
  unavailable("rms_norm_forward");
}
void rms_norm_backward(void*, void*, const void*, const void*, const void*, const float*, DType, std::int64_t,
                       std::int64_t, float*, StreamId) {
  unavailable("rms_norm_backward");
}
void layer_norm_forward(void*, float*, float*, const void*, const void*, const void*, DType, std::int64_t,
                        std::int64_t, float, StreamId) {
  unavailable("layer_norm_forward");
}
void layer_norm_backward(void*, void*, void*, const void*, const void*, const void*, const float*,
                         const float*, DType, std::int64_t, std::int64_t, float*, StreamId) {
  unavailable("layer_norm_backward");
}

}  // namespace remat::cuda
