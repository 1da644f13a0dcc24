// The collectives as ops: each a definition whose forward runs the process
// group's collective and whose backward runs the transposed one.
#include "parallel/comm_ops.h"

#include "ops/op.h"

namespace remat {

namespace {

struct CommState {
  std::shared_ptr<ProcessGroup> group;  // the nodes keep it alive
  std::vector<std::int64_t> send_rows = {}, recv_rows = {};  // all_to_all: rows to and from each rank
  const std::vector<std::int64_t>* known_recv_rows = nullptr;  // all_to_all: skip the count exchange
  std::vector<std::int64_t>* recv_rows_out = nullptr;           // all_to_all: where the caller reads recv_rows
};

// The bytes a collective moves: its input's.
OpCost comm_cost(const std::vector<Tensor>& in, const CommState&) {
  return {0, 0, double(in[0].nbytes())};
}

Op<CommState> define(const char* name, OpResults (*forward)(const std::vector<Tensor>&, CommState&),
                     std::vector<Tensor> (*backward)(const OpBackward<CommState>&), const char* summary) {
  return Op<CommState>({.name = name, .inputs = {"x"}, .outputs = {{"y"}}, .collective = true, .summary = summary},
                       {.forward = forward, .backward = backward, .cost = comm_cost});
}

// all_to_all: the gradient goes back the way the rows came (both counts known).
OpResults a2a_fwd(const std::vector<Tensor>& in, CommState& s) {
  Tensor out = s.group->all_to_all(in[0].detach().contiguous(), s.send_rows, s.recv_rows, s.known_recv_rows);
  *s.recv_rows_out = s.recv_rows;
  s.known_recv_rows = nullptr;
  s.recv_rows_out = nullptr;
  return {{out}};
}

std::vector<Tensor> a2a_bwd(const OpBackward<CommState>& b) {
  std::vector<std::int64_t> back;
  const CommState& s = b.state();
  return {s.group->all_to_all(b.grad().contiguous(), s.recv_rows, back, &s.send_rows)};
}

// all_reduce: every rank's output depends on every rank's input.
OpResults all_reduce_fwd(const std::vector<Tensor>& in, CommState& s) {
  Tensor out = in[0].detach().contiguous().clone();
  s.group->all_reduce(out, ReduceOp::sum);
  return {{out}};
}

std::vector<Tensor> all_reduce_bwd(const OpBackward<CommState>& b) {
  Tensor s = b.grad().contiguous().clone();
  b.state().group->all_reduce(s, ReduceOp::sum);
  return {s};
}

OpResults all_gather_fwd(const std::vector<Tensor>& in, CommState& s) {
  return {{s.group->all_gather(in[0].detach().contiguous())}};
}

std::vector<Tensor> all_gather_bwd(const OpBackward<CommState>& b) {
  return {b.state().group->reduce_scatter(b.grad().contiguous(), ReduceOp::sum)};
}

OpResults reduce_scatter_fwd(const std::vector<Tensor>& in, CommState& s) {
  return {{s.group->reduce_scatter(in[0].detach().contiguous(), ReduceOp::sum)}};
}

std::vector<Tensor> reduce_scatter_bwd(const OpBackward<CommState>& b) {
  return {b.state().group->all_gather(b.grad().contiguous())};
}

const Op<CommState> kAllToAll = define("all_to_all", a2a_fwd, a2a_bwd, "rows of dim 0 exchanged between ranks");
const Op<CommState> kAllReduce =
    define("all_reduce", all_reduce_fwd, all_reduce_bwd, "the sum over ranks, on every rank");
const Op<CommState> kAllGather =
    define("all_gather", all_gather_fwd, all_gather_bwd, "every rank's x concatenated along dim 0");
const Op<CommState> kReduceScatter =
    define("reduce_scatter", reduce_scatter_fwd, reduce_scatter_bwd, "the sum over ranks, this rank's slice of dim 0");

}  // namespace

Tensor all_to_all(const std::shared_ptr<ProcessGroup>& group, const Tensor& x,
                  const std::vector<std::int64_t>& send_rows, std::vector<std::int64_t>& recv_rows,
                  const std::vector<std::int64_t>* known_recv_rows) {
  return kAllToAll.call1({x}, {group, send_rows, {}, known_recv_rows, &recv_rows});
}

Tensor all_reduce_sum(const std::shared_ptr<ProcessGroup>& group, const Tensor& x) {
  return kAllReduce.call1({x}, {group});
}

Tensor all_gather(const std::shared_ptr<ProcessGroup>& group, const Tensor& x) {
  return kAllGather.call1({x}, {group});
}

Tensor reduce_scatter(const std::shared_ptr<ProcessGroup>& group, const Tensor& x) {
  return kReduceScatter.call1({x}, {group});
}

}  // namespace remat
