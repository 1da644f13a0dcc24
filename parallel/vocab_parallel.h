// The vocabulary-parallel embedding and LM-head loss of tensor parallelism
// (Megatron-LM, Shoeybi et al. 2019): rank r of a group of T holds rows
// [vocab_begin, vocab_begin + V/T) of the table / head weight, and no rank
// ever holds logits for the whole vocabulary.
#pragma once

#include <cstdint>
#include <memory>

#include "parallel/process_group.h"

namespace remat {

// This rank's part of embedding(full_table, ids): rows of `table` [Vr, d]
// for ids in [vocab_begin, vocab_begin + Vr), zeros for the others (i64 ids
// of any shape -> [..., d]). Summed over the group (tp_reduce / tp_scatter)
// it is the lookup in the whole table; each rank's table gets the gradient
// of its own rows only.
Tensor vocab_parallel_embedding(const Tensor& table, const Tensor& ids, std::int64_t vocab_begin);

// The mean cross-entropy of linear(h, w) over the whole vocabulary, where
// this rank holds w = rows [vocab_begin, vocab_begin + Vr) of the head's
// weight [V, d] (V = `vocab`): h [..., d] (the same on every rank of
// `group`), targets [...] in [0, V) or ignore_index. Each chunk of `chunk`
// rows computes its [chunk, Vr] logits, all-reduces their row maxima, then
// the row sums of exp and the target logits (two all-reduces a chunk), so
// every rank returns the same loss (0-dim f32). As linear_cross_entropy
// (ops/linear_cross_entropy.h), the gradients are made in the forward: dw
// for this rank's rows and this rank's part of dh, which the caller sums
// over the group (h comes through tp_copy or tp_gather). CPU only.
Tensor vocab_parallel_cross_entropy(const std::shared_ptr<ProcessGroup>& group, const Tensor& h, const Tensor& w,
                                    const Tensor& targets, std::int64_t vocab_begin, std::int64_t vocab,
                                    std::int64_t chunk, std::int64_t ignore_index = -100);

}  // namespace remat
