// Collectives as autograd ops: all_reduce_sum (backward: all_reduce_sum of
// the gradient), all_to_all (backward: the reverse all_to_all), all_gather
// (backward: reduce_scatter of the gradient) and reduce_scatter (backward:
// all_gather of the gradient). The group must be the same on every rank; the
// nodes keep it alive. Every rank must run the backward of every collective
// node (keep their outputs connected to the loss on every rank).
#pragma once

#include <memory>
#include <vector>

#include "parallel/process_group.h"

namespace remat {

// Rows of `x` (dim 0) sent send_rows[r] to rank r; returns the received rows
// and sets `recv_rows`. Pass `known_recv_rows` to skip the count exchange.
Tensor all_to_all(const std::shared_ptr<ProcessGroup>& group, const Tensor& x,
                  const std::vector<std::int64_t>& send_rows, std::vector<std::int64_t>& recv_rows,
                  const std::vector<std::int64_t>* known_recv_rows = nullptr);
// The sum of `x` over ranks, on every rank (backward: the sum over ranks of
// the gradients, since every rank's output depends on every rank's input).
Tensor all_reduce_sum(const std::shared_ptr<ProcessGroup>& group, const Tensor& x);
// Every rank's `x` concatenated along dim 0.
Tensor all_gather(const std::shared_ptr<ProcessGroup>& group, const Tensor& x);
// The sum over ranks, this rank's slice of dim 0.
Tensor reduce_scatter(const std::shared_ptr<ProcessGroup>& group, const Tensor& x);

}  // namespace remat
