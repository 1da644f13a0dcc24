// Embedding lookup: rows of a table gathered by integer ids.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/tensor.h"
#include "ops/kernel_table.h"

namespace remat {

// weight [V, d] floating, ids i32/i64 of any shape with values in [0, V) ->
// [ids..., d] in weight's dtype. The weight gradient scatter-adds the output
// gradient rows, in a fixed order (deterministic). Saves ids only.
Tensor embedding(const Tensor& weight, const Tensor& ids);

// The kernels a device registers for embedding (operands in their own dtypes).
struct EmbeddingKernels {
  // out [out_shape] = weight [V, d] rows at the ids; host_ids holds the ids
  // (already checked to lie in [0, V)) in row-major order.
  Tensor (*forward)(const Tensor& weight, const Tensor& ids, const std::vector<std::int64_t>& host_ids,
                    const Shape& out_shape);
  // The weight gradient [vocab, d]: row v sums the rows of g [tokens, d]
  // whose id is v, in increasing token order, in f32 (rounded to `dtype`
  // or left in f32; the runner rounds it).
  Tensor (*backward)(const Tensor& g, const Tensor& ids, std::int64_t vocab, std::int64_t d, DType dtype);
};
KernelTable<EmbeddingKernels>& embedding_kernels();

// The token positions of each id, grouped by id in increasing id and, within
// an id, in increasing position (a stable counting sort): the rows of id v
// are order[start[v] .. start[v + 1]); touched lists the ids that occur. For
// the weight gradient's kernels. Throws ShapeError for an id outside [0, vocab).
struct IdGroups {
  std::vector<std::int64_t> start, touched, order;
};
IdGroups group_ids(const std::vector<std::int64_t>& ids, std::int64_t vocab);
// `ids` (on any device) as i64 values in row-major order; empty for meta ids
// (no values; the CPU's copies are made on meta).
std::vector<std::int64_t> host_ids(const Tensor& ids);

}  // namespace remat
