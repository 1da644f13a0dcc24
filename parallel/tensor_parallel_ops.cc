// The tensor-parallel collectives: definitions whose forward and backward
// run the group's all-reduce, all-gather or reduce-scatter along a dim.
#include "parallel/tensor_parallel_ops.h"

#include "ops/cast.h"
#include "ops/matmul.h"
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

// The whole tensor used alike on every rank: its gradient is too, so each
// rank keeps its piece of it.
Tensor own_piece(ProcessGroup& g, const Tensor& x, std::int64_t dim) {
  const std::int64_t n = x.size(dim) / g.size();
  return x.detach().narrow(dim, g.rank() * n, n).contiguous();
}

OpResults gather_whole_fwd(const std::vector<Tensor>& in, TpState& s) {
  return {{gather_along(*s.group, in[0], s.dim)}};
}
std::vector<Tensor> gather_whole_bwd(const OpBackward<TpState>& b) {
  return {own_piece(*b.state().group, b.grad(), b.state().dim)};
}

OpResults split_fwd(const std::vector<Tensor>& in, TpState& s) { return {{own_piece(*s.group, in[0], s.dim)}}; }
std::vector<Tensor> split_bwd(const OpBackward<TpState>& b) {
  return {gather_along(*b.state().group, b.grad(), b.state().dim)};
}

Op<TpState> define(const char* name, OpResults (*forward)(const std::vector<Tensor>&, TpState&),
                   std::vector<Tensor> (*backward)(const OpBackward<TpState>&), const char* summary) {
  return Op<TpState>({.name = name, .inputs = {"x"}, .outputs = {{"y"}}, .collective = true, .summary = summary},
                     {.forward = forward, .backward = backward, .cost = tp_cost});
}

const Op<TpState> kCopy = define("tp_copy", copy_fwd, copy_bwd, "x; backward sums the gradient over the group");
const Op<TpState> kReduce =
    define("tp_reduce", reduce_fwd, reduce_bwd, "the sum over the group; backward passes the gradient");
const Op<TpState> kGather =
    define("tp_gather", gather_fwd, gather_bwd, "the ranks' pieces concatenated along dim; backward reduce-scatters");
const Op<TpState> kScatter =
    define("tp_scatter", scatter_fwd, scatter_bwd, "the sum over the group, this rank's piece; backward gathers");

const Op<TpState> kGatherWhole = define("tp_gather_whole", gather_whole_fwd, gather_whole_bwd,
                                      "the ranks' pieces concatenated along dim; backward keeps this rank's piece");
const Op<TpState> kSplit =
    define("tp_split", split_fwd, split_bwd, "this rank's piece along dim; backward gathers");

void check_dim(const char* op, const Tensor& x, std::int64_t dim) {
  REMAT_CHECK(dim >= 0 && dim < x.dim(), ShapeError, op, ": dim ", dim, " out of range for ", shape_str(x.sizes()));
}

void check_split(const char* op, const ProcessGroup& g, const Tensor& x, std::int64_t dim) {
  check_dim(op, x, dim);
  REMAT_CHECK(x.size(dim) % g.size() == 0, ShapeError, op, ": dim ", dim, " of ", shape_str(x.sizes()),
              " does not divide into the ", g.size(), " ranks of the tensor-parallel group");
}

// ---------------------------------------------------------------------------
// sp_column_linears: the column-parallel projections of a sequence piece

struct SpLinearsState {
  std::shared_ptr<ProcessGroup> group;
};

constexpr std::size_t kMaxSpWeights = 3;
const char* const kSpWeightNames[kMaxSpWeights] = {"w0", "w1", "w2"};

void check_sp_linears(const OpDef& op, const std::vector<Tensor>& in, const SpLinearsState&) {
  REMAT_CHECK(in.size() >= 2 && in.size() <= kMaxSpWeights + 1, Error, op.name(), ": expected x and 1 to ",
              kMaxSpWeights, " weights, got ", in.size(), " tensors");
  const Tensor& x = in[0];
  REMAT_CHECK(x.dim() == 3, ShapeError, op.name(), ": x must be this rank's piece [B, S/T, d] of the sequence, got ",
              shape_str(x.sizes()));
  for (std::size_t i = 1; i < in.size(); ++i)
    REMAT_CHECK(in[i].dim() == 2 && in[i].size(1) == x.size(2) && in[i].dtype() == x.dtype() &&
                    in[i].device() == x.device(),
                ShapeError, op.name(), ": weight ", i - 1, " must be [out, ", x.size(2), "] ", x.dtype(), " on ",
                x.device(), " (x is ", shape_str(x.sizes()), "), got [", shape_str(in[i].sizes()), "] ", in[i].dtype(),
                " on ", in[i].device());
}

// The gathered sequence stays sequence-first, [S, B, d], as the all-gather
// lays it out: the products take its rows in that order and only their
// [.., n]-wide results (and gradients) are turned between [B, S, n] and
// [S, B, n], never a whole [B, S, d] (which the collectives along dim 1
// would copy once more).
Tensor gathered_rows(ProcessGroup& g, const Tensor& piece) {
  const Tensor X = g.all_gather(front(piece, 1));  // [S, B, d]
  return X.view({X.size(0) * X.size(1), X.size(2)});
}

// A projection's [B, S, n] gradient as [S * B, n] rows, in f32.
Tensor sequence_first(const Tensor& g) {
  const Tensor t = g.detach().transpose(0, 1).contiguous();
  return (t.dtype() == DType::f32 ? t : cast(t, DType::f32)).view({-1, g.size(2)});
}

OpResults sp_linears_fwd(const std::vector<Tensor>& in, SpLinearsState& s) {
  const Tensor X2 = gathered_rows(*s.group, in[0]);
  const std::int64_t B = in[0].size(0), m = X2.size(0), S = m / B, d = X2.size(1);
  std::vector<Tensor> ys, weights;
  for (std::size_t i = 1; i < in.size(); ++i) {
    const Tensor w = in[i].detach();
    const std::int64_t n = w.size(0);
    const Tensor y = matmul_kernels().run(X2.device(), &MatmulKernels::product, X2, w.t(), Shape{m, n}, 1, m, n, d);
    ys.push_back(y.view({S, B, n}).transpose(0, 1).contiguous());
    weights.push_back(w);
  }
  weights.resize(kMaxSpWeights);  // (saves of absent weights stay empty)
  return {ys, weights};
}

std::vector<Tensor> sp_linears_bwd(const OpBackward<SpLinearsState>& b) {
  ProcessGroup& group = *b.state().group;
  const std::size_t n = b.num_inputs() - 1;
  const Device dev = b.grad(0).device();
  std::vector<Tensor> grads(n + 1);
  bool weights = false;
  for (std::size_t i = 1; i <= n; ++i) weights = weights || b.needs(i);
  if (weights) {  // the whole sequence again (backward communication), for the weights' gradients only
    const Tensor X2 = gathered_rows(group, b.saved("x"));
    const std::int64_t m = X2.size(0), d = X2.size(1);
    for (std::size_t i = 0; i < n; ++i) {
      if (!b.needs(i + 1)) continue;
      const Tensor g = sequence_first(b.grad(i));
      const std::int64_t out = g.size(1);
      grads[i + 1] = matmul_kernels().run(dev, &MatmulKernels::product, g.t(), X2, Shape{out, d}, 1, out, d, m);
    }
  }
  if (!b.needs(0)) return grads;
  // x's gradient: the projections' sum, in order, in one f32 buffer of
  // rows [S * B, d]; then this rank's piece of its sum over the ranks. (Each
  // gradient is turned sequence-first again rather than kept from the loop
  // above: the gathered sequence is gone before this buffer exists, and only
  // one [.., n]-wide copy lives at a time.)
  Tensor dX;
  for (std::size_t i = 0; i < n; ++i) {
    const Tensor g = sequence_first(b.grad(i));
    const Tensor& w = b.saved(kSpWeightNames[i]);
    const std::int64_t m = g.size(0), k = g.size(1), d = w.size(1);
    if (!dX.defined()) dX = matmul_kernels().run(dev, &MatmulKernels::product, g, w, Shape{m, d}, 1, m, d, k);
    else matmul_kernels().run(dev, &MatmulKernels::accumulate, dX, g, w);
  }
  const std::int64_t B = b.input(0).sizes[0], d = dX.size(1);  // (x: [B, S/T, d])
  const Tensor piece = scatter_along(group, dX.view({dX.size(0) / B, B, d}), 0);  // [S/T, B, d]
  grads[0] = piece.transpose(0, 1).contiguous();
  return grads;
}

OpCost sp_linears_cost(const std::vector<Tensor>& in, const SpLinearsState& s) {
  const Tensor& x = in[0];
  const double m = double(x.size(0) * x.size(1) * s.group->size()), d = double(x.size(2));
  const double es = double(element_size(x.dtype()));
  OpCost c{0, 0, m * d * es};
  for (std::size_t i = 1; i < in.size(); ++i) {
    const double n = double(in[i].size(0));
    c.matmul_flops += 2 * m * n * d;
    c.bytes += (n * d + m * n) * es;
  }
  return c;
}

const Op<SpLinearsState> kSpLinears(
    {.name = "sp_column_linears",
     .inputs = {"x", "weights"},
     .variadic = true,
     .outputs = {{"y"}},
     .variadic_outputs = true,
     .saves = {{"x", SaveFrom::input, 0, inputs_mask({1, 2, 3})},
               {"w0", SaveFrom::intermediate, 0, inputs_mask({0})},
               {"w1", SaveFrom::intermediate, 1, inputs_mask({0})},
               {"w2", SaveFrom::intermediate, 2, inputs_mask({0})}},
     .saves_inputs_first = true,
     .collective = true,
     .summary = "the ranks' sequence pieces gathered, times each weight transposed; saves the piece, gathers "
                "again in backward"},
    {.check = check_sp_linears, .forward = sp_linears_fwd, .backward = sp_linears_bwd, .cost = sp_linears_cost});

}  // namespace

Tensor tp_copy(const std::shared_ptr<ProcessGroup>& group, const Tensor& x) {
  return kCopy.call1({x}, {group, 0});
}

Tensor tp_reduce(const std::shared_ptr<ProcessGroup>& group, const Tensor& x) {
  return kReduce.call1({x}, {group, 0});
}

Tensor tp_gather(const std::shared_ptr<ProcessGroup>& group, const Tensor& x, std::int64_t dim) {
  check_dim("tp_gather", x, dim);
  return kGather.call1({x}, {group, dim});
}

Tensor tp_scatter(const std::shared_ptr<ProcessGroup>& group, const Tensor& x, std::int64_t dim) {
  check_split("tp_scatter", *group, x, dim);
  return kScatter.call1({x}, {group, dim});
}

Tensor tp_gather_whole(const std::shared_ptr<ProcessGroup>& group, const Tensor& x, std::int64_t dim) {
  check_dim("tp_gather_whole", x, dim);
  return kGatherWhole.call1({x}, {group, dim});
}

std::vector<Tensor> sp_column_linears(const std::shared_ptr<ProcessGroup>& group, const Tensor& x,
                                      const std::vector<Tensor>& weights) {
  std::vector<Tensor> in = {x};
  in.insert(in.end(), weights.begin(), weights.end());
  return kSpLinears(std::move(in), {group});
}

Tensor tp_split(const std::shared_ptr<ProcessGroup>& group, const Tensor& x, std::int64_t dim) {
  check_split("tp_split", *group, x, dim);
  return kSplit.call1({x}, {group, dim});
}

}  // namespace remat
