// The elementwise kernels in a build without CUDA: each says why it cannot run.
#include "cuda/elementwise.h"
#include "cuda/no_cuda.h"

namespace remat::cuda {

void binary(BinaryOp, void*, const void*, const Strided&, const void*, const Strided&, DType,
            StreamId) {
  unavailable("cuda::binary");
}
void binary_scalar(BinaryOp, void*, const void*, const Strided&, float, bool, DType, StreamId) {
  unavailable("cuda::binary_scalar");
}
void unary(UnaryOp, void*, const void*, const Strided&, DType, float, StreamId) {
  unavailable("cuda::unary");
}
void unary_backward(UnaryOp, void*, const void*, const Strided&, const void*, const Strided&, DType,
                    float, StreamId) {
  unavailable("cuda::unary_backward");
}
void update(UpdateOp, void*, const Strided&, const void*, const Strided&, float, DType, StreamId) {
  unavailable("cuda::update");
}

}  // namespace remat::cuda
