// The tensor-parallel collectives: definitions whose forward and backward
// run the group's all-reduce, all-gather or reduce-scatter along a dim.
#include "parallel/tensor_parallel_ops.h"

#include "ops/cast.h"
#include "ops/op.h"

namespace remat {

namespace {

struct TpState {
  std::shared_ptr<ProcessGroup> group;  // the nodes keep it alive
  std::int64_t dim = 0;
};

OpCost tp_cost(const std::vector<Tensor>& in, const TpState&) { return {0, 0, double(in[0].nbytes())}; }

// The collectives reduce f32; 16-bit floats are widened and rounded back once.
Tensor reduced_sum(ProcessGroup& g, const Tensor& x) {
  Tensor t = x.dtype() == DType::f32 ? x.detach().contiguous().clone() : cast(x.detach(), DType::f32).contiguous();
  g.all_reduce(t, ReduceOp::sum);
  return t.dtype() == x.dtype() ? t : cast(t, x.dtype());
}

// dim moved to the front (contiguous), so the group's dim-0 collectives apply.
Tensor front(const Tensor& x, std::int64_t dim) {
  return dim == 0 ? x.detach().contiguous() : x.detach().transpose(0, dim).contiguous();
}
Tensor back(const Tensor& x, std::int64_t dim) { return dim == 0 ? x : x.transpose(0, dim).contiguous(); }

Tensor gather_along(ProcessGroup& g, const Tensor& x, std::int64_t dim) {
  return back(g.all_gather(front(x, dim)), dim);
}

Tensor scatter_along(ProcessGroup& g, const Tensor& x, std::int64_t dim) {
  REMAT_CHECK(x.size(dim) % g.size() == 0, ShapeError, "tp_scatter: dim ", dim, " of ", shape_str(x.sizes()),
              " does not divide into the ", g.size(), " ranks of the tensor-parallel group");
  Tensor f = front(x, dim);
  if (f.dtype() != DType::f32) return back(cast(g.reduce_scatter(cast(f, DType::f32), ReduceOp::sum), x.dtype()), dim);
  return back(g.reduce_scatter(f, ReduceOp::sum), dim);
}

OpResults copy_fwd(const std::vector<Tensor>& in, TpState&) { return {{in[0].detach()}}; }
std::vector<Tensor> copy_bwd(const OpBackward<TpState>& b) { return {reduced_sum(*b.state().group, b.grad())}; }

OpResults reduce_fwd(const std::vector<Tensor>& in, TpState& s) { return {{reduced_sum(*s.group, in[0])}}; }
std::vector<Tensor> reduce_bwd(const OpBackward<TpState>& b) { return {b.grad()}; }

OpResults gather_fwd(const std::vector<Tensor>& in, TpState& s) { return {{gather_along(*s.group, in[0], s.dim)}}; }
std::vector<Tensor> gather_bwd(const OpBackward<TpState>& b) {
  return {scatter_along(*b.state().group, b.grad(), b.state().dim)};
}

OpResults scatter_fwd(const std::vector<Tensor>& in, TpState& s) { return {{scatter_along(*s.group, in[0], s.dim)}}; }
std::vector<Tensor> scatter_bwd(const OpBackward<TpState>& b) {
  return {gather_along(*b.state().group, b.grad(), b.state().dim)};
}

Op<TpState> define(const char* name, OpResults (*forward)(const std::vector<Tensor>&, TpState&),
                   std::vector<Tensor> (*backward)(const OpBackward<TpState>&), const char* summary) {
  return Op<TpState>({.name = name, .inputs = {"x"}, .outputs = {{"y"}}, .summary = summary},
                     {.forward = forward, .backward = backward, .cost = tp_cost});
}

const Op<TpState> kCopy = define("tp_copy", copy_fwd, copy_bwd, "x; backward sums the gradient over the group");
const Op<TpState> kReduce =
    define("tp_reduce", reduce_fwd, reduce_bwd, "the sum over the group; backward passes the gradient");
const Op<TpState> kGather =
    define("tp_gather", gather_fwd, gather_bwd, "the ranks' pieces concatenated along dim; backward reduce-scatters");
const Op<TpState> kScatter =
    define("tp_scatter", scatter_fwd, scatter_bwd, "the sum over the group, this rank's piece; backward gathers");

}  // namespace

Tensor tp_copy(const std::shared_ptr<ProcessGroup>& group, const Tensor& x) {
  return kCopy.call1({x}, {group, 0});
}

Tensor tp_reduce(const std::shared_ptr<ProcessGroup>& group, const Tensor& x) {
  return kReduce.call1({x}, {group, 0});
}

Tensor tp_gather(const std::shared_ptr<ProcessGroup>& group, const Tensor& x, std::int64_t dim) {
  REMAT_CHECK(dim >= 0 && dim < x.dim(), ShapeError, "tp_gather: dim ", dim, " out of range for ", shape_str(x.sizes()));
  return kGather.call1({x}, {group, dim});
}

Tensor tp_scatter(const std::shared_ptr<ProcessGroup>& group, const Tensor& x, std::int64_t dim) {
  REMAT_CHECK(dim >= 0 && dim < x.dim(), ShapeError, "tp_scatter: dim ", dim, " out of range for ",
              shape_str(x.sizes()));
  REMAT_CHECK(x.size(dim) % group->size() == 0, ShapeError, "tp_scatter: dim ", dim, " of ", shape_str(x.sizes()),
              " does not divide into the ", group->size(), " ranks of the tensor-parallel group");
  return kScatter.call1({x}, {group, dim});
}

}  // namespace remat
