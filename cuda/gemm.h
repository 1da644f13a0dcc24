// GEMM on CUDA through cuBLASLt: row-major, strided batches, f32 / bf16 /
// f16 operands with f32 accumulation (f32 operands use full f32 math, no
// TF32, so results match the CPU to rounding). The algorithm for each shape is
// chosen once by cuBLASLt's heuristic and cached, so a shape always runs the
// same algorithm and gives the same bits (the deterministic mode needs this).
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/dtype.h"
#include "engine/memory_backend.h"

namespace remat::cuda {

// One (batched) product, row-major: for b in [0, batch)
//   C_b [m, n] = alpha * op(A_b) op(B_b) + beta * C_b (+ bias[n] broadcast over rows)
// op(A) is [m, k] (A stored [k, m] when trans_a), op(B) is [k, n] (B stored
// [n, k] when trans_b). lda/ldb/ldc are the stored matrices' row strides and
// stride_* the element distance between batch entries. A, B, C share `dtype`;
// bias (nullable, dtype `dtype`) is fused into the epilogue.
struct GemmProblem {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  const void* a = nullptr;
  std::int64_t lda = 0, stride_a = 0;
  const void* b = nullptr;
  std::int64_t ldb = 0, stride_b = 0;
  void* c = nullptr;
  std::int64_t ldc = 0, stride_c = 0;
  std::int64_t batch = 1;
  DType dtype = DType::f32;
  const void* bias = nullptr;
};

// Workspace bytes gemm may use (callers allocate it from the caching allocator).
std::size_t gemm_workspace_bytes();

// Runs the product on `stream`; throws DeviceError naming the shapes if
// cuBLASLt has no algorithm for them or fails.
void gemm(const GemmProblem& args, void* workspace, std::size_t workspace_bytes, StreamId stream);

// Number of distinct shapes whose algorithm is cached (for tests).
std::size_t gemm_cached_algorithms();

}  // namespace remat::cuda
