// cuBLASLt GEMM. Row-major products are computed as the column-major product
// of the transposes: C^T [n, m] = op(B)^T op(A)^T, so cuBLASLt sees B as its
// first operand and A as its second, with the same transpose flags.
#include "cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "engine/error.h"
#include "engine/immortal.h"
#include "engine/meta_mirror.h"

namespace remat::cuda {

namespace {

constexpr std::size_t kWorkspaceBytes = 32 << 20;  // cuBLAS's recommendation for Hopper

std::string describe(const GemmProblem& g) {
  std::ostringstream os;
  os << "gemm " << (g.trans_a ? "A^T" : "A") << (g.trans_b ? " B^T" : " B") << " m=" << g.m << " n=" << g.n
     << " k=" << g.k << " batch=" << g.batch << " lda=" << g.lda << " ldb=" << g.ldb << " ldc=" << g.ldc
     << " dtype=" << dtype_name(g.dtype) << (g.bias ? " +bias" : "");
  return os.str();
}

void check(cublasStatus_t st, const char* what, const GemmProblem& g) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw DeviceError(std::string("cuBLASLt ") + what + " failed (" + cublasLtGetStatusString(st) + ") for " +
                      describe(g));
}

cudaDataType_t cuda_type(DType t, const GemmProblem& g) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default:
      throw DTypeError(std::string("cuBLASLt gemm: expected f32, bf16 or f16 operands, got ") +
                       dtype_name(t) + " for " + describe(g));
  }
}

// The largest power of two (<= 256) dividing the address: algorithms are
// chosen for the alignment they will see.
std::uint32_t alignment(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 256;
  while (a > 1 && (v % a) != 0) a >>= 1;
  return a;
}

using Key = std::tuple<int, bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                       std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool,
                       std::uint32_t, std::uint32_t, std::uint32_t, int>;

// RAII wrappers for the descriptors of one call.
struct Desc {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Desc() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

class Gemm {
 public:
  void run(const GemmProblem& g, void* workspace, std::size_t workspace_bytes, StreamId stream) {
    int device = 0;
    cudaGetDevice(&device);
    cublasLtHandle_t h = handle(device, g);
    const cudaDataType_t type = cuda_type(g.dtype, g);
    Desc d;
    check(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate", g);
    // Column-major view: first operand = B, second = A.
    const cublasOperation_t ta = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "set TRANSA", g);
    check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "set TRANSB", g);
    if (g.bias) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)), "set EPILOGUE", g);
      check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)),
            "set BIAS_POINTER", g);
      check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof(type)),
            "set BIAS_DATA_TYPE", g);
    }
    // Stored shapes in column-major terms: row-major [r, c] with row stride ld
    // is column-major [c, r] with leading dimension ld.
    const std::uint64_t b_rows = std::uint64_t(g.trans_b ? g.k : g.n), b_cols = std::uint64_t(g.trans_b ? g.n : g.k);
    const std::uint64_t a_rows = std::uint64_t(g.trans_a ? g.m : g.k), a_cols = std::uint64_t(g.trans_a ? g.k : g.m);
    check(cublasLtMatrixLayoutCreate(&d.la, type, b_rows, b_cols, g.ldb), "layout of B", g);
    check(cublasLtMatrixLayoutCreate(&d.lb, type, a_rows, a_cols, g.lda), "layout of A", g);
    check(cublasLtMatrixLayoutCreate(&d.lc, type, std::uint64_t(g.n), std::uint64_t(g.m), g.ldc), "layout of C", g);
    if (g.batch > 1) {
      const std::int32_t count = std::int32_t(g.batch);
      const std::int64_t strides[3] = {g.stride_b, g.stride_a, g.stride_c};
      cublasLtMatrixLayout_t layouts[3] = {d.la, d.lb, d.lc};
      for (int i = 0; i < 3; ++i) {
        check(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
              "set BATCH_COUNT", g);
        check(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i],
                                               sizeof(strides[i])),
              "set STRIDED_BATCH_OFFSET", g);
      }
    }
    const std::uint32_t al_a = alignment(g.b), al_b = alignment(g.a), al_c = alignment(g.c);
    const Key key{int(g.dtype), g.trans_a, g.trans_b, g.m,        g.n,      g.k,  g.lda, g.ldb, g.ldc,
                  g.stride_a,   g.stride_b, g.stride_c, g.batch, g.bias != nullptr, al_a, al_b, al_c, device};
    const cublasLtMatmulAlgo_t algo = find_algo(h, key, d, g, workspace_bytes, al_a, al_b, al_c);
    check(cublasLtMatmul(h, d.op, &g.alpha, g.b, d.la, g.a, d.lb, &g.beta, g.c, d.lc, g.c, d.lc, &algo, workspace,
                         workspace_bytes, reinterpret_cast<cudaStream_t>(stream)),
          "Matmul", g);
  }

  std::size_t cached() {
    std::lock_guard<std::mutex> lock(mu_);
    return algos_.size();
  }

 private:
  cublasLtHandle_t handle(int device, const GemmProblem& g) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = handles_.find(device);
    if (it != handles_.end()) return it->second;
    cublasLtHandle_t h = nullptr;
    check(cublasLtCreate(&h), "Create", g);
    handles_[device] = h;  // lives for the process, like the device's allocator
    return h;
  }

  cublasLtMatmulAlgo_t find_algo(cublasLtHandle_t h, const Key& key, Desc& d, const GemmProblem& g,
                                 std::size_t workspace_bytes, std::uint32_t al_a, std::uint32_t al_b,
                                 std::uint32_t al_c) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = algos_.find(key); it != algos_.end()) return it->second;
    }
    check(cublasLtMatmulPreferenceCreate(&d.pref), "PreferenceCreate", g);
    const std::uint64_t ws = workspace_bytes;
    check(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
          "set MAX_WORKSPACE_BYTES", g);
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    const std::uint32_t aligns[4] = {al_a, al_b, al_c, al_c};
    for (int i = 0; i < 4; ++i)
      check(cublasLtMatmulPreferenceSetAttribute(d.pref, align_attr[i], &aligns[i], sizeof(aligns[i])),
            "set MIN_ALIGNMENT", g);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    check(cublasLtMatmulAlgoGetHeuristic(h, d.op, d.la, d.lb, d.lc, d.lc, d.pref, 1, &result, &found),
          "AlgoGetHeuristic", g);
    if (found == 0) throw DeviceError("cuBLASLt has no algorithm for " + describe(g));
    std::lock_guard<std::mutex> lock(mu_);
    return algos_.emplace(key, result.algo).first->second;
  }

  std::mutex mu_;
  std::map<int, cublasLtHandle_t> handles_;
  std::map<Key, cublasLtMatmulAlgo_t> algos_;
};

Gemm& gemm_state() {
  static remat::detail::Immortal<Gemm> g;
  return g.get();
}

}  // namespace

std::size_t gemm_workspace_bytes() { return kWorkspaceBytes; }

void gemm(const GemmProblem& args, void* workspace, std::size_t workspace_bytes, StreamId stream) {
  if (args.m == 0 || args.n == 0 || args.batch == 0 || meta_addresses_active()) return;
  gemm_state().run(args, workspace, workspace_bytes, stream);
}

std::size_t gemm_cached_algorithms() { return gemm_state().cached(); }

}  // namespace remat::cuda
