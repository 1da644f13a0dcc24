// Tensor parallelism of the decoder (Megatron-LM, Shoeybi et al. 2019) and
// its sequence parallelism (Korthikanti et al. 2022): T ranks split every
// block's matmuls — q/k/v and the MLP's gate/up by output (heads, FFN
// columns), o_proj and down by input — and the embedding and LM head by
// vocabulary rows; the norms, o_proj's bias and MoE blocks stay whole on
// every rank. docs/PARALLEL.md#tensor-and-sequence-parallel.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "models/decoder.h"
#include "parallel/tensor_parallel_ops.h"

namespace remat {

// Which part of a parameter rank t of T holds: slice `index` of `parts`
// equal slices along `dim` (parts 1: the whole parameter). Key/value
// projections with fewer heads than ranks are held whole-head by several
// ranks (parts = the key/value heads).
struct TpSlice {
  std::int64_t dim = 0, parts = 1, index = 0;
  bool split() const { return parts > 1; }
  // The rank counts the slice's squares and saves it: the first of the
  // ranks that hold it (every rank for a slice per rank).
  bool first_holder(std::int64_t rank, std::int64_t ranks) const { return rank % (ranks / parts) == 0; }
};
// The slice of parameter `name` of a model of config `c` on rank t of T.
TpSlice tp_slice(const ModelConfig& c, const std::string& name, std::int64_t ranks, std::int64_t rank);

// Error naming --tp and the config unless T ranks can split config c: T
// must divide the attention heads, the key/value heads (or be a multiple
// of them: each then held by T / kv ranks), the FFN width and the
// vocabulary; with sp, T >= 2 and T must divide seq; sp with MoE blocks is
// not supported yet (their router statistics would need the whole batch).
void check_tensor_parallel(const ModelConfig& c, std::int64_t ranks, bool sp);

// A job's groups under tensor parallelism over its T innermost
// (neighbouring) ranks: rank r is tensor-parallel rank r % T of `tp`, and
// the ranks of one tensor-parallel rank, in order of r / T, are `rest`: the
// job of the other axes (data, expert, pipeline). T = 1: {null, job}.
// check_tensor_parallel's errors, and one naming --tp unless the job's size
// is a multiple of T. A collective over `job`.
struct TensorParallelJob {
  std::shared_ptr<TensorParallel> tp;
  std::shared_ptr<ProcessGroup> rest;
};
TensorParallelJob split_tensor_parallel(const std::shared_ptr<ProcessGroup>& job, const ModelConfig& c,
                                        std::int64_t ranks, bool sp);

// The sub-group of `group` that shares a key/value head of config c over T
// = group->size() ranks (null when every rank holds its own). A collective.
std::shared_ptr<ProcessGroup> kv_head_group(const ModelConfig& c, const std::shared_ptr<ProcessGroup>& group);

// Keeps this rank's slice of every parameter of `model` (built whole: one
// process's values) and points its layers at `tp`: heads, FFN columns and
// vocabulary rows become this rank's. Call before the optimizer and the
// gradient reducer see the parameters; check_tensor_parallel first.
void apply_tensor_parallel(DecoderModel& model, std::shared_ptr<const TensorParallel> tp);

// The parameter count of `model` in one process's layout: every
// tensor-parallel slice counted whole (num_parameters() without --tp).
std::int64_t whole_parameters(const DecoderModel& model);

// The slice `s` of a whole parameter's values, in elements of its own
// (a copy: the whole may be freed).
Tensor tp_take_slice(const Tensor& whole, const TpSlice& s);
// Elements [begin, begin + n) of slice `s` (flattened) of a tensor of shape
// `whole` (flattened) as runs that are consecutive in both: fn(whole
// element, slice element, count) for each, in order (a dim-0 slice is one
// run, a dim-1 slice one per row).
void for_each_slice_run(const Shape& whole, const TpSlice& s, std::int64_t begin, std::int64_t n,
                        const std::function<void(std::int64_t, std::int64_t, std::int64_t)>& fn);

// The whole parameter from every rank's slice (each rank passes its own,
// of one shape): an all-gather over `group`; the same on every rank.
Tensor tp_whole(ProcessGroup& group, const Tensor& slice, const TpSlice& s);

}  // namespace remat
