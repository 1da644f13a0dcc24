// Matrix products on f32 (16-bit inputs are computed in f32). Transposed
// operands (views such as w.t()) are passed to the GEMM as transposes, not
// copied.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/tensor.h"
#include "ops/kernel_table.h"

namespace remat {

// a [..., m, k] @ b [k, n] -> [..., m, n] (leading dims of a fold into m), or
// a [B..., m, k] @ b [B..., k, n] with identical batch dims (a batched product).
Tensor matmul(const Tensor& a, const Tensor& b);
// Batched product of 3-D tensors: [B, m, k] @ [B, k, n] -> [B, m, n].
Tensor bmm(const Tensor& a, const Tensor& b);
// The best of `tries` 1024^3 f32 products on the CPU, in FLOP/s: the
// machine's practical GEMM peak. Its buffers are plain host memory, not the
// caching allocator's, so measuring leaves the allocator as it was.
double cpu_gemm_peak_flops(int tries);

// x [..., in] @ w[out, in]^T (+ bias [out]) -> [..., out].
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor());

// A 2-D (or batched) operand as a row-major BLAS call takes it: its data,
// whether it is stored transposed, its row stride and its batch stride.
struct GemmOperand {
  Tensor keep;  // keeps the data alive (a contiguous copy when the strides need one)
  const void* ptr = nullptr;
  bool trans = false;
  std::int64_t ld = 0;
  std::int64_t batch_stride = 0;
};
// `t` [batch..., r, c] as a GEMM operand in its own dtype: read in place when
// its last two dims have a unit stride and its batch dims fold into one
// stride, else a contiguous copy.
GemmOperand gemm_operand(const Tensor& t);

// The kernels a device registers for matmul.
struct MatmulKernels {
  // out [out_shape] = a @ b over `batch` products of [m, k] @ [k, n]; a and b
  // are [batch..., m, k] / [batch..., k, n] (any strides gemm_operand takes).
  Tensor (*product)(const Tensor& a, const Tensor& b, const Shape& out_shape, std::int64_t batch, std::int64_t m,
                    std::int64_t n, std::int64_t k);
  // Optional (nullptr: none). For a 2-D product a [..., k] @ b [k, n] with
  // both gradients wanted and f32 operands: {dA, dB} as one fused step;
  // dB comes in b's storage layout when b_transposed.
  std::vector<Tensor> (*grads_2d)(const Tensor& g, const Tensor& a, const Tensor& b, bool b_transposed) = nullptr;
  // out [m, n] (contiguous, the compute dtype) += a [m, k] @ b [k, n] (2-D, any
  // strides gemm_operand takes): a product accumulated over k in blocks, with
  // the bits of the whole product when each block's k is a multiple of the
  // GEMM's reduction block (linear_cross_entropy's weight gradient).
  void (*accumulate)(Tensor& out, const Tensor& a, const Tensor& b) = nullptr;
};
KernelTable<MatmulKernels>& matmul_kernels();

}  // namespace remat
