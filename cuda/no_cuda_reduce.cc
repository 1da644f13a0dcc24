// reduce.h in a build without CUDA.
#include "cuda/no_cuda.h"
#include "cuda/reduce.h"

namespace remat::cuda {

void reduce_sum(void*, const void*, DType, const Strided&, const Strided&, float, float*, StreamId) {
  unavailable("reduce_sum");
}
std::int64_t reduce_sum_workspace(const Strided&, const Strided&) { return 0; }
void reduce_max(void*, std::int64_t*, const void*, DType, const Strided&, std::int64_t, std::int64_t,
                StreamId) {
  unavailable("reduce_max");
}
void reduce_max_backward(void*, const Strided&, std::int64_t, const void*, const std::int64_t*, DType,
                         StreamId) {
  unavailable("reduce_max_backward");
}

}  // namespace remat::cuda
