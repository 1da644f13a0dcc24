// The CPU GEMM: C = alpha * op(A) op(B) + beta * C on row-major f32 matrices,
// through Eigen's GEMM or OpenBLAS's sgemm. Internal to ops/.
#pragma once

#include <cstdint>

namespace remat::ops_detail {

enum class GemmBackend { eigen, openblas };

// The backend large GEMMs use (default: openblas; REMAT_GEMM=eigen|openblas
// overrides it at start-up).
GemmBackend gemm_backend();
void set_gemm_backend(GemmBackend b);

// Row-major: op(A) is [m, k], op(B) is [k, n], C is [m, n]; lda/ldb/ldc are
// row strides of the stored (untransposed) matrices. beta is 0 or 1.
// `serial` asks for no thread team of its own (use it inside parallel loops:
// there Eigen runs on the calling thread; outside one, Eigen may still split
// a large product across the team).
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
          float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
          float beta, float* c, std::int64_t ldc, bool serial = false);

}  // namespace remat::ops_detail
