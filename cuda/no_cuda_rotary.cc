// The rotary embedding kernels in a build without CUDA: each says why it cannot run.
#include "cuda/no_cuda.h"
#include "cuda/rotary.h"

namespace remat::cuda {

void rotary_table(float*, float*, std::int64_t, std::int64_t, double, std::int64_t, float,
                  StreamId) {
  unavailable("cuda::rotary_table");
}
void rotary(void*, const void*, const Strided&, DType, const float*, const float*, StreamId) {
  unavailable("cuda::rotary");
}

}  // namespace remat::cuda
