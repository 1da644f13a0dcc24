// cuda/index.h in a build without the CUDA toolkit: every function says so.
#include "cuda/index.h"
#include "cuda/no_cuda.h"

namespace remat::cuda {

void index_select_rows(void*, const void*, DType, const void*, DType, std::int64_t, std::int64_t,
                       std::int64_t, std::int64_t, std::int64_t, StreamId) {
  unavailable("index_select_rows");
}
void gather(void*, const Strided&, const void*, const Strided&, const void*, DType, const Strided&, DType,
            int, StreamId) {
  unavailable("gather");
}
void scatter_add_scan(void*, DType, const Strided&, const void*, DType, const Strided&, const void*, DType,
                      const Strided&, int, std::int64_t, StreamId) {
  unavailable("scatter_add_scan");
}
void scatter_add_lists(void*, DType, const void*, DType, const Strided&, const std::int64_t*,
                       const std::int64_t*, const std::int64_t*, std::int64_t, StreamId) {
  unavailable("scatter_add_lists");
}
void index_add_lists(void*, DType, std::int64_t, std::int64_t, std::int64_t, const void*, DType,
                     const Strided&, int, const std::int64_t*, const std::int64_t*, const std::int64_t*,
                     std::int64_t, StreamId) {
  unavailable("index_add_lists");
}

}  // namespace remat::cuda
