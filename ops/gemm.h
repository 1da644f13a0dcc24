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

// The two products C1 = op(A1) op(B1) and C2 = op(A2) op(B2) (alpha 1,
// beta 0) side by side, one thread each through OpenBLAS, when the team has
// at least two threads and the backend is OpenBLAS; otherwise one after the
// other through gemm(). For a backward's dX and dW, which have equal FLOPs:
// two single-threaded GEMMs waste less to synchronisation than two
// two-thread ones on small shapes. Each product's result depends only on
// its own shape (a single-threaded OpenBLAS run), never on the team size.
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
