// The SwiGLU kernels in a build without CUDA: each says why it cannot run.
#include "cuda/no_cuda.h"
#include "cuda/swiglu.h"

namespace remat::cuda {

void swiglu_forward(void*, const void*, const Strided&, const void*, const Strided&, DType,
                    StreamId) {
  unavailable("cuda::swiglu_forward");
}
void swiglu_backward(void*, void*, const void*, const void*, const void*, std::int64_t, DType,
                     StreamId) {
  unavailable("cuda::swiglu_backward");
}

}  // namespace remat::cuda
