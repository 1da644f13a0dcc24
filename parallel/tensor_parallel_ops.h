// The collectives of tensor and sequence parallelism as autograd ops
// (Megatron-LM's conjugate pairs, Shoeybi et al. 2019; Korthikanti et al.
// 2022). Unlike parallel/comm_ops.h, whose ranks each own a share of the
// loss, the ranks of a tensor-parallel group compute one loss together:
// every rank holds its value, and a gradient that reaches a replicated
// tensor is the same on every rank. So
//   tp_copy    forward: x (replicated)          backward: the sum over ranks
//   tp_reduce  forward: the sum over ranks      backward: the gradient as is
//   tp_gather  forward: the ranks' pieces of dim `dim` concatenated
//              backward: the sum over ranks, this rank's piece (reduce-scatter)
//   tp_scatter forward: the sum over ranks, this rank's piece of `dim`
//              backward: the gathered pieces (all-gather)
//   tp_gather_whole / tp_split: the pair around a part that every rank
//              runs whole and alike (a MoE block under sequence
//              parallelism): all-gather forward, this rank's piece of the
//              gradient backward; and the converse
// A sum of 16-bit floats is taken in f32 and rounded back once. Every rank
// of the group must run each op, and its backward (docs/PARALLEL.md#tensor-
// and-sequence-parallel).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "parallel/process_group.h"

namespace remat {

// x; backward sums the gradient over the group (x feeds a column-parallel
// region, or is a parameter whose ranks each see part of the batch).
Tensor tp_copy(const std::shared_ptr<ProcessGroup>& group, const Tensor& x);
// The sum of x over the group; backward passes the gradient through (the
// output of a row-parallel region).
Tensor tp_reduce(const std::shared_ptr<ProcessGroup>& group, const Tensor& x);
// The ranks' x concatenated along `dim` (every rank's x of one shape);
// backward: reduce-scatter along `dim`.
Tensor tp_gather(const std::shared_ptr<ProcessGroup>& group, const Tensor& x, std::int64_t dim);
// The sum of x over the group, this rank's 1/size of `dim` (which must
// divide; ShapeError naming the shape otherwise); backward: all-gather.
Tensor tp_scatter(const std::shared_ptr<ProcessGroup>& group, const Tensor& x, std::int64_t dim);
// The ranks' x concatenated along `dim`, for a computation every rank runs
// alike on the whole (so the gradient is the same on every rank); backward:
// this rank's piece of the gradient, no communication.
Tensor tp_gather_whole(const std::shared_ptr<ProcessGroup>& group, const Tensor& x, std::int64_t dim);
// This rank's 1/size of `dim` of x, which every rank holds alike (ShapeError
// unless it divides); backward: all-gather of the ranks' gradients.
Tensor tp_split(const std::shared_ptr<ProcessGroup>& group, const Tensor& x, std::int64_t dim);

// Sequence parallelism's column-parallel projections (Korthikanti et al.
// 2022, section 4.2.2): x is this rank's piece [B, S/T, d] of the sequence;
// returns the whole sequence times each weight [n_i, d] transposed,
// [B, S, n_i], for 1 to 3 weights of x's dtype. It saves the piece, not the
// gathered sequence: backward gathers it again (backward communication) for
// the weights' gradients, and reduce-scatters x's (the projections' summed
// in order), so a rank holds 1/T of the input under every plan.
std::vector<Tensor> sp_column_linears(const std::shared_ptr<ProcessGroup>& group, const Tensor& x,
                                      const std::vector<Tensor>& weights);

// The tensor-parallel group of a model's layers and how their regions begin
// and end: with sequence parallelism (sp) the tensors between regions are
// this rank's 1/T of the sequence (dim 1 of [B, S, d]); without, every rank
// holds them whole.
struct TensorParallel {
  std::shared_ptr<ProcessGroup> group;     // the T ranks that split every block
  std::shared_ptr<ProcessGroup> kv_group;  // the ranks that share a key/value head (null: each holds its own)
  bool sp = false;
  int rank() const { return group->rank(); }
  int size() const { return group->size(); }
  // Into a column-parallel region: tp_gather along the sequence (sp), else tp_copy.
  Tensor enter(const Tensor& x) const { return sp ? tp_gather(group, x, 1) : tp_copy(group, x); }
  // Out of a row-parallel region: tp_scatter along the sequence (sp), else tp_reduce.
  Tensor leave(const Tensor& x) const { return sp ? tp_scatter(group, x, 1) : tp_reduce(group, x); }
  // A replicated parameter used on the tensors between regions: under sp
  // each rank sees its part of the sequence, so its gradient is summed over
  // the group (tp_copy); else `w`.
  Tensor replicated(const Tensor& w) const { return sp ? tp_copy(group, w) : w; }
  // Around a part every rank runs whole (a MoE block): under sp, the whole
  // sequence in (tp_gather_whole) and this rank's part out (tp_split); else x.
  Tensor whole(const Tensor& x) const { return sp ? tp_gather_whole(group, x, 1) : x; }
  Tensor own_part(const Tensor& x) const { return sp ? tp_split(group, x, 1) : x; }
  // A key/value projection's parameter held by several ranks (fewer
  // key/value heads than ranks): its gradient summed over them.
  Tensor kv_shared(const Tensor& w) const { return kv_group ? tp_copy(kv_group, w) : w; }
};

}  // namespace remat
