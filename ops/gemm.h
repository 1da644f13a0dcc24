// The CPU GEMM: C = alpha * op(A) op(B) + beta * C on row-major f32 matrices,
// through BLIS, OpenBLAS or Eigen. Internal to ops/.
#pragma once

#include <cstdint>

namespace remat::ops_detail {

enum class GemmBackend { eigen, openblas, blis };

// The backend CPU products use (default: blis; REMAT_GEMM=blis|openblas|eigen
// chooses at start-up). Each gives the same bits at any thread count; the
// three give different bits from each other.
GemmBackend gemm_backend();
void set_gemm_backend(GemmBackend b);
// The start-up choice (REMAT_GEMM, else blis), for code that switched back ends.
GemmBackend default_gemm_backend();
// The back end's name as REMAT_GEMM spells it ("blis", "openblas", "eigen").
const char* gemm_backend_name(GemmBackend b);

// The reduction block of the current back end: a product over k accumulated
// block by block (C = A_1 B_1, then C += A_i B_i with beta 1, each A_i [m, kb]
// with kb a multiple of it, the last block any size) has the bits of the
// whole product. BLIS's KC for the running CPU (256 on AVX2 Zen); 0 for the
// strip back ends, which guarantee no such size.
std::int64_t gemm_reduction_block();

// Row-major: op(A) is [m, k], op(B) is [k, n], C is [m, n]; lda/ldb/ldc are
// row strides of the stored (untransposed) matrices. beta is 0 or 1.
// BLIS computes the whole product on the team (one thread inside a parallel
// region): it splits only the loops over C, never the reduction, and each
// micro-tile is always computed by the same kernel over the same k blocks.
// OpenBLAS and Eigen split the reduction by their team size, so for them C
// is computed in row or column strips fixed by (m, n) alone, each strip by
// one single-threaded call, the strips spread over the team. Either way the
// bits depend on the shape and the backend, never on the thread count.
// `serial` runs on the calling thread alone (inside parallel loops).
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
          float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
          float beta, float* c, std::int64_t ldc, bool serial = false);

// The two products C1 = op(A1) op(B1) and C2 = op(A2) op(B2) (alpha 1,
// beta 0): for a backward's dX and dW. BLIS runs them one after the other on
// the team; the strip back ends spread both products' strips over one team.
// The bits are those of two gemm() calls.
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
