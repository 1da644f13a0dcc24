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
// C is computed in row or column strips fixed by (m, n) alone, each strip by
// one single-threaded backend call, the strips spread over the team: the
// bits depend on the shape and the backend, never on the thread count.
// `serial` runs the strips on the calling thread (inside parallel loops).
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
          float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
          float beta, float* c, std::int64_t ldc, bool serial = false);

// The two products C1 = op(A1) op(B1) and C2 = op(A2) op(B2) (alpha 1,
// beta 0), both products' strips spread over one team: for a backward's dX
// and dW. The bits are those of two gemm() calls.
struct PairedGemm {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  const float* a = nullptr;
  std::int64_t lda = 0;
  const float* b = nullptr;
  std::int64_t ldb = 0;
  float* c = nullptr;
  std::int64_t ldc = 0;
};
void gemm_pair(const PairedGemm& first, const PairedGemm& second);

}  // namespace remat::ops_detail
