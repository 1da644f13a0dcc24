// The multi-tensor optimizer kernels in a build without CUDA.
#include "cuda/adamw.h"
#include "cuda/no_cuda.h"

namespace remat::cuda {

void adamw_step(const AdamWSlot*, std::int64_t, std::int64_t, const AdamWScalars&, StreamId) {
  unavailable("adamw_step");
}
double sum_squares(const TensorSlot*, std::int64_t, std::int64_t, double*, StreamId) {
  unavailable("sum_squares");
}
void scale_tensors(const TensorSlot*, std::int64_t, std::int64_t, float, StreamId) {
  unavailable("scale_tensors");
}

}  // namespace remat::cuda
