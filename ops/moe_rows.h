// The row movement of a routed MoE block, as kernels each device registers:
// the dispatch gather (token rows to expert order), the weighted per-token
// sum of the combine, and the combine's gradients. Every result is the same
// bits on every device (f32 arithmetic in the CPU's order, one rounding to
// the output dtype, no atomics). moe/dispatch.cc builds the differentiable
// dispatch and combine ops on these.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/tensor.h"
#include "ops/kernel_table.h"

namespace remat {

// The kernels a device registers for the MoE row movement. Index tensors are
// i64 on the operands' device.
struct MoeRowsKernels {
  // out[r] = x[idx[r]] * w[r] for the rows of out (w undefined: weight 1, an
  // exact copy), in f32 rounded once to out's dtype. out is a contiguous
  // [rows, d] tensor in the kernels' compute dtype (KernelTable::compute_dtype),
  // x [tokens, d], w [rows].
  void (*gather_rows)(Tensor& out, const Tensor& x, const Tensor& idx, const Tensor& w);
  // The per-row routing index this device keeps for sum_rows (on `device`,
  // contiguous): from each row's token (token_of_row) or each row's slot
  // among the tokens' top_k (slot_of_row), whichever its kernels read.
  Tensor (*routing_index)(const Tensor& token_of_row, const Tensor& slot_of_row, Device device);
  // out[t] = the sum over token t's rows r, in increasing r, of w[r] * y[r]
  // (w undefined: weight 1), in f32 rounded once to `dtype` (or left in f32
  // for the runner to round); y [rows, d], index from routing_index, out
  // [tokens, d]. The order does not depend on the thread count.
  Tensor (*sum_rows)(const Tensor& y, const Tensor& w, const Tensor& index, std::int64_t tokens, std::int64_t top_k,
                     DType dtype);
  // out[r] = dot(a[a_rows[r]], b[r]) in f32 (ops' eight-lane order) for the
  // rows of b; a [tokens, d], b [rows, d]; out f32 [rows].
  Tensor (*row_dots)(const Tensor& a, const Tensor& a_rows, const Tensor& b);
};
KernelTable<MoeRowsKernels>& moe_rows_kernels();

// The combine's gradients from g [tokens, d], the expert rows y [rows, d],
// their weights w [rows] and token_of_row: {gy, gw} with gy[r] = w[r] *
// g[token_of_row[r]] rounded to ydt (undefined unless want_gy; needs w) and
// gw[r] = dot(g[token_of_row[r]], y[r]) rounded to wdt (undefined unless
// want_gw; needs y).
std::vector<Tensor> moe_combine_grads(const Tensor& g, const Tensor& y, const Tensor& w, const Tensor& token_of_row,
                                      bool want_gy, bool want_gw, DType ydt, DType wdt);

}  // namespace remat
