#include "ops/gemm.h"

#include <blis.h>
#include <cblas.h>
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "engine/parallel_for.h"

extern "C" void openblas_set_num_threads(int);

namespace remat::ops_detail {

namespace {

GemmBackend initial_backend() {
  const char* env = std::getenv("REMAT_GEMM");
  for (GemmBackend b : {GemmBackend::eigen, GemmBackend::openblas})
    if (env && std::strcmp(env, gemm_backend_name(b)) == 0) return b;
  return GemmBackend::blis;
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

// OpenBLAS and Eigen: the fixed tiling of C [m, n] into row or column strips, a function of the
// shape alone: every element of C is computed by one single-threaded call on
// its strip, so its summation order, and so its bits, never depend on the
// thread count (OpenBLAS's and Eigen's own threading split the work by the
// team size, and their results differ by a few ulps between team sizes).
// Strips of at least kMinStrip rows/columns keep the repeated packing of the
// other operand small next to the product; kMaxStrips bounds the count.
struct Strips {
  bool by_rows = true;
  std::int64_t extent = 0, size = 0, count = 0;
};
constexpr std::int64_t kMaxStrips = 16, kMinStrip = 64;

Strips strips_of(std::int64_t m, std::int64_t n) {
  Strips s;
  s.by_rows = m >= n;
  s.extent = s.by_rows ? m : n;
  s.size = std::max(kMinStrip, (s.extent + kMaxStrips - 1) / kMaxStrips);
  s.size = (s.size + 15) / 16 * 16;
  s.count = (s.extent + s.size - 1) / s.size;
  return s;
}

// One thread's product, on the backend: OpenBLAS is kept at one thread of
// its own and Eigen at one (both set once, here).
void single_thread_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                        const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
                        float* c, std::int64_t ldc) {
  static const bool once = [] {
    openblas_set_num_threads(1);
    Eigen::setNbThreads(1);
    return true;
  }();
  (void)once;
  if (gemm_backend() == GemmBackend::eigen) {
    eigen_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n),
              int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

// The whole product on BLIS with `threads` threads of its own: BLIS splits
// only the loops over C (never the reduction), each micro-tile always by the
// same kernel over the same k blocks, so the bits do not depend on `threads`.
// Its "sup" path for skinny shapes is off: with it, whether a product took
// the packed path or sup's (other kernels, other k blocks) depended on m and
// n, so a product split by rows or accumulated over k in blocks (the chunked
// loss) did not give the whole product's bits; it cost nothing measurable on
// bench-dense (2568.5 vs 2577.9 ms median step, 6 rounds interleaved).
void blis_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
               std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc,
               int threads) {
  rntm_t rntm = BLIS_RNTM_INITIALIZER;
  bli_rntm_set_num_threads(threads, &rntm);
  bli_rntm_disable_l3_sup(&rntm);
  bli_sgemm_ex(ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, m, n, k, &alpha,
               const_cast<float*>(a), lda, 1, const_cast<float*>(b), ldb, 1, &beta, c, ldc, 1, nullptr, &rntm);
}

// A product and its strips: strip(i) computes strip i of C.
struct StripedGemm {
  bool ta = false, tb = false;
  std::int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  const float* a = nullptr;
  std::int64_t lda = 0;
  const float* b = nullptr;
  std::int64_t ldb = 0;
  float beta = 0.0f;
  float* c = nullptr;
  std::int64_t ldc = 0;
  Strips strips;

  void strip(std::int64_t i) const {
    const std::int64_t lo = i * strips.size, hi = std::min(strips.extent, lo + strips.size);
    const std::int64_t r0 = strips.by_rows ? lo : 0, r1 = strips.by_rows ? hi : m;
    const std::int64_t c0 = strips.by_rows ? 0 : lo, c1 = strips.by_rows ? n : hi;
    if (r0 == r1 || c0 == c1) return;
    if (k == 0) {  // C = beta * C, beta 0 or 1
      if (beta == 0.0f)
        for (std::int64_t r = r0; r < r1; ++r) std::memset(c + r * ldc + c0, 0, std::size_t(c1 - c0) * sizeof(float));
      return;
    }
    // Rows r0..r1 of op(A) and columns c0..c1 of op(B).
    const float* as = ta ? a + r0 : a + r0 * lda;
    const float* bs = tb ? b + c0 * ldb : b + c0;
    single_thread_gemm(ta, tb, r1 - r0, c1 - c0, k, alpha, as, lda, bs, ldb, beta, c + r0 * ldc + c0, ldc);
  }
};

}  // namespace

GemmBackend gemm_backend() { return backend_slot().load(); }
GemmBackend default_gemm_backend() { return initial_backend(); }

const char* gemm_backend_name(GemmBackend b) {
  switch (b) {
    case GemmBackend::eigen: return "eigen";
    case GemmBackend::openblas: return "openblas";
    case GemmBackend::blis: return "blis";
  }
  return "?";
}
void set_gemm_backend(GemmBackend b) { backend_slot().store(b); }

std::int64_t gemm_reduction_block() {
  if (gemm_backend() != GemmBackend::blis) return 0;
  return std::int64_t(bli_cntx_get_blksz_def_dt(BLIS_FLOAT, BLIS_KC, bli_gks_query_cntx()));
}

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc, bool serial) {
  if (gemm_backend() == GemmBackend::blis) {
    if (m == 0 || n == 0) return;
    blis_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
              serial || omp_in_parallel() ? 1 : num_threads());
    return;
  }
  const StripedGemm g{trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, strips_of(m, n)};
  if (serial) {
    for (std::int64_t i = 0; i < g.strips.count; ++i) g.strip(i);
    return;
  }
  parallel_for(0, g.strips.count, 1, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) g.strip(i);
  });
}

void gemm_pair(const PairedGemm& first, const PairedGemm& second) {
  if (gemm_backend() == GemmBackend::blis) {
    for (const PairedGemm* p : {&first, &second})
      gemm(p->trans_a, p->trans_b, p->m, p->n, p->k, 1.0f, p->a, p->lda, p->b, p->ldb, 0.0f, p->c, p->ldc);
    return;
  }
  // Both products' strips in one loop: the same strips, so the same bits, as
  // two gemm() calls, with one team for both.
  const auto striped = [](const PairedGemm& p) {
    return StripedGemm{p.trans_a, p.trans_b, p.m, p.n, p.k, 1.0f, p.a, p.lda, p.b, p.ldb, 0.0f, p.c, p.ldc,
                       strips_of(p.m, p.n)};
  };
  const StripedGemm g1 = striped(first), g2 = striped(second);
  parallel_for(0, g1.strips.count + g2.strips.count, 1, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) i < g1.strips.count ? g1.strip(i) : g2.strip(i - g1.strips.count);
  });
}

}  // namespace remat::ops_detail
