// matmul's CUDA kernel: cuBLASLt (cuda/gemm.h) in the operands' dtype with
// f32 accumulation, its workspace from the caching allocator.
#include "cuda/gemm.h"
#include "cuda/op_util.h"
#include "engine/allocator.h"
#include "ops/matmul.h"

namespace remat::cuda {
namespace {

// out (batch products of [m, n], contiguous) = a @ b + beta * out.
void run_gemm(Tensor& out, const Tensor& a, const Tensor& b, std::int64_t batch, std::int64_t m, std::int64_t n,
              std::int64_t k, float beta) {
  const GemmOperand ga = gemm_operand(a.detach()), gb = gemm_operand(b.detach());
  GemmProblem g;
  g.beta = beta;
  g.trans_a = ga.trans;
  g.trans_b = gb.trans;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = ga.ptr;
  g.lda = ga.ld;
  g.stride_a = ga.batch_stride;
  g.b = gb.ptr;
  g.ldb = gb.ld;
  g.stride_b = gb.batch_stride;
  g.c = out.raw_data();
  g.ldc = n;
  g.stride_c = m * n;
  g.batch = batch;
  g.dtype = a.dtype();
  Tensor workspace;
  {
    CategoryScope cat(MemoryCategory::workspace);
    workspace = empty({std::int64_t(gemm_workspace_bytes())}, TensorOptions(DType::boolean, a.device()));
  }
  gemm(g, workspace.raw_data(), gemm_workspace_bytes(), op_stream());
}

Tensor product(const Tensor& a, const Tensor& b, const Shape& out_shape, std::int64_t batch, std::int64_t m,
               std::int64_t n, std::int64_t k) {
  Tensor out = empty(out_shape, TensorOptions(a.dtype(), a.device()));
  if (k == 0) return out.zero_();
  run_gemm(out, a, b, batch, m, n, k, 0.0f);
  return out;
}

void accumulate(Tensor& out, const Tensor& a, const Tensor& b) {
  if (a.size(1) > 0) run_gemm(out, a, b, 1, a.size(0), b.size(1), a.size(1), 1.0f);
}

const KernelRegistration<MatmulKernels> kCuda(matmul_kernels(), DeviceType::CUDA,
                                              {.product = product, .accumulate = accumulate}, KernelDTypes::native);

}  // namespace
}  // namespace remat::cuda
