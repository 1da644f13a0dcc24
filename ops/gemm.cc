#include "ops/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <Eigen/Core>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "engine/parallel_for.h"

extern "C" void openblas_set_num_threads(int);

namespace remat::ops_detail {

namespace {

GemmBackend initial_backend() {
  const char* env = std::getenv("REMAT_GEMM");
  if (env && std::strcmp(env, "eigen") == 0) return GemmBackend::eigen;
  return GemmBackend::openblas;
}

std::atomic<GemmBackend>& backend_slot() {
  static std::atomic<GemmBackend> b{initial_backend()};
  return b;
}

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMat, 0, Eigen::OuterStride<>>;
using MutMap = Eigen::Map<RowMat, 0, Eigen::OuterStride<>>;

template <typename A, typename B>
void eigen_product(const A& a, const B& b, float alpha, float beta, MutMap& c) {
  if (beta == 0.0f) {
    if (alpha == 1.0f)
      c.noalias() = a * b;
    else
      c.noalias() = alpha * (a * b);
  } else {
    if (alpha == 1.0f)
      c.noalias() += a * b;
    else
      c.noalias() += alpha * (a * b);
  }
}

void eigen_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
                float* c, std::int64_t ldc) {
  MutMap cm(c, m, n, Eigen::OuterStride<>(ldc));
  const ConstMap am(a, ta ? k : m, ta ? m : k, Eigen::OuterStride<>(lda));
  const ConstMap bm(b, tb ? n : k, tb ? k : n, Eigen::OuterStride<>(ldb));
  if (!ta && !tb) eigen_product(am, bm, alpha, beta, cm);
  if (!ta && tb) eigen_product(am, bm.transpose(), alpha, beta, cm);
  if (ta && !tb) eigen_product(am.transpose(), bm, alpha, beta, cm);
  if (ta && tb) eigen_product(am.transpose(), bm.transpose(), alpha, beta, cm);
}

}  // namespace

GemmBackend gemm_backend() { return backend_slot().load(); }
void set_gemm_backend(GemmBackend b) { backend_slot().store(b); }

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc, bool serial) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0.0f)
      for (std::int64_t i = 0; i < m; ++i) std::memset(c + i * ldc, 0, std::size_t(n) * sizeof(float));
    return;
  }
  if (serial || omp_in_parallel() || gemm_backend() == GemmBackend::eigen) {
    // Eigen runs single-threaded when called from inside a parallel region.
    eigen_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  openblas_set_num_threads(num_threads());
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

namespace {
void run_gemm(const PairedGemm& g, bool one_thread) {
  if (!one_thread) {
    gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, 1.0f, g.a, g.lda, g.b, g.ldb, 0.0f, g.c, g.ldc);
    return;
  }
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {
    for (std::int64_t i = 0; i < g.m; ++i) std::memset(g.c + i * g.ldc, 0, std::size_t(g.n) * sizeof(float));
    return;
  }
  // Inside a parallel region OpenBLAS's OpenMP build runs on the calling thread alone.
  cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans, g.trans_b ? CblasTrans : CblasNoTrans,
              int(g.m), int(g.n), int(g.k), 1.0f, g.a, int(g.lda), g.b, int(g.ldb), 0.0f, g.c, int(g.ldc));
}
}  // namespace

void gemm_pair(const PairedGemm& first, const PairedGemm& second) {
  if (num_threads() < 2 || omp_in_parallel() || gemm_backend() != GemmBackend::openblas) {
    run_gemm(first, false);
    run_gemm(second, false);
    return;
  }
#pragma omp parallel num_threads(2)
  run_gemm(omp_get_thread_num() == 0 ? first : second, true);
}

}  // namespace remat::ops_detail
