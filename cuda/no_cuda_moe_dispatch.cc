// The MoE row-movement kernels in a build without CUDA.
#include "cuda/moe_dispatch.h"
#include "cuda/no_cuda.h"

namespace remat::cuda {

void moe_gather_rows(void*, DType, const void*, DType, const std::int64_t*, const float*, std::int64_t, std::int64_t,
                     StreamId) {
  unavailable("moe_gather_rows");
}
void moe_invert_rows(std::int64_t*, std::int64_t, const std::int64_t*, std::int64_t, StreamId) {
  unavailable("moe_invert_rows");
}
void moe_combine_rows(void*, DType, const void*, DType, const float*, const std::int64_t*, std::int64_t, std::int64_t,
                      std::int64_t, StreamId) {
  unavailable("moe_combine_rows");
}
void moe_row_dots(float*, const void*, DType, const std::int64_t*, const void*, DType, std::int64_t, std::int64_t,
                  StreamId) {
  unavailable("moe_row_dots");
}

}  // namespace remat::cuda
