// index_select, gather, scatter_add and index_add: each op's definition,
// forward and backward side by side, and the CPU kernels.
#include "ops/index.h"

#include <algorithm>
#include <array>
#include <utility>

#include "ops/kernel_util.h"
#include "ops/op.h"

namespace remat {

using namespace ops_detail;

namespace {

// An operand's strides split into the dims other than `dim` (the "rest",
// which every operand of one op iterates together) and its stride along `dim`.
struct Split {
  Shape rest;
  std::int64_t along = 0;
};

Split split_strides(const Tensor& t, std::int64_t d) {
  Split s;
  for (std::int64_t k = 0; k < t.dim(); ++k)
    if (k != d) s.rest.push_back(t.stride(k));
  s.along = t.dim() > 0 ? t.stride(d) : 1;
  return s;
}

Shape drop_dim(const Shape& sizes, std::int64_t d) {
  Shape s = sizes;
  s.erase(s.begin() + d);
  return s;
}

// Calls fn(offsets, n, inner_strides) for runs of the innermost dim of
// `sizes`, like detail::for_each_run, but splits the element range itself
// across threads (runs are cut at chunk boundaries), so a long innermost dim
// still runs in parallel. Every position is visited exactly once, and the
// callers write each output element from one position only (in a fixed order
// within it), so results do not depend on the chunking or thread count.
template <std::size_t K, typename Fn>
void for_each_chunked_run(const Shape& sizes, const std::array<const Shape*, K>& strides,
                          std::int64_t grain, Fn&& fn) {
  const std::int64_t nd = std::int64_t(sizes.size());
  const std::int64_t total = shape_numel(sizes);
  if (total == 0) return;
  const std::int64_t last = nd > 0 ? sizes[std::size_t(nd - 1)] : 1;
  std::array<std::int64_t, K> inner{};
  if (nd > 0)
    for (std::size_t k = 0; k < K; ++k) inner[k] = (*strides[k])[std::size_t(nd - 1)];
  parallel_for(0, total, grain, [&](std::int64_t b, std::int64_t e) {
    std::array<std::int64_t, 16> idx{};
    std::int64_t rem = b;
    for (std::int64_t d = nd - 1; d >= 0; --d) {
      idx[std::size_t(d)] = rem % sizes[std::size_t(d)];
      rem /= sizes[std::size_t(d)];
    }
    while (b < e) {
      std::array<std::int64_t, K> off{};
      for (std::int64_t d = 0; d + 1 < nd; ++d)
        for (std::size_t k = 0; k < K; ++k) off[k] += idx[std::size_t(d)] * (*strides[k])[std::size_t(d)];
      const std::int64_t pos = nd > 0 ? idx[std::size_t(nd - 1)] : 0;
      for (std::size_t k = 0; k < K; ++k) off[k] += pos * inner[k];
      const std::int64_t len = std::min(e - b, last - pos);
      fn(off, len, inner);
      b += len;
      if (nd == 0) break;
      idx[std::size_t(nd - 1)] = 0;
      for (std::int64_t d = nd - 2; d >= 0; --d) {
        if (++idx[std::size_t(d)] < sizes[std::size_t(d)]) break;
        idx[std::size_t(d)] = 0;
      }
    }
  });
}

// Grain (rest positions per task) for loops doing k elements of work each.
std::int64_t grain_for(std::int64_t k) {
  return std::max<std::int64_t>(1, (1 << 14) / std::max<std::int64_t>(k, 1));
}

}  // namespace

Tensor host_index(const Tensor& index) {
  NoGradGuard ng;
  // Mirroring a GPU, the copies below are made in host memory: nothing on meta.
  if (index.device().is_meta() && meta_kernels() != DeviceType::CPU) return index.detach();
  // meta: stays on meta (no values to read); the cast and contiguous copy below land there, as on the CPU
  Tensor ix = index.device().is_meta() ? index.detach() : index.detach().to(kCPU);
  ix = ix.dtype() == DType::i64 ? ix : ix.to(DType::i64);
  return ix.contiguous();
}

KernelTable<IndexKernels>& index_kernels() {
  static KernelTable<IndexKernels> t("index ops");
  return t;
}

namespace {

// `index` as a contiguous i64 tensor on the CPU after checking every value
// lies in [0, n) (n = x.size(d)); the error names the bad index, where it is,
// and the size. On CUDA this is where the index values are validated: the
// kernels trust them.
Tensor checked_index(const char* op, const Tensor& index, const Tensor& x, std::int64_t d) {
  NoGradGuard ng;
  Tensor ix = host_index(index);
  if (skip_compute(ix)) return ix;  // meta: shapes only
  const std::int64_t n = x.size(d);
  const std::int64_t* p = ix.data<std::int64_t>();
  const std::int64_t count = ix.numel();
  for (std::int64_t i = 0; i < count; ++i) {
    if (p[i] >= 0 && p[i] < n) continue;
    Shape pos(std::size_t(ix.dim()), 0);
    std::int64_t rem = i;
    for (std::int64_t k = ix.dim() - 1; k >= 0; --k) {
      pos[std::size_t(k)] = rem % ix.size(k);
      rem /= ix.size(k);
    }
    throw ShapeError(detail::concat(op, ": index ", p[i], " (at position ", shape_str(pos),
                                    " of index ", describe(index),
                                    ") is out of range for dim ", d, " of size ", n,
                                    " (input ", describe(x), ")"));
  }
  return ix;
}

// out[r, j] = x[r, idx[r, j]] over rest positions r (the dims other than d,
// of sizes `rest`) and j in [0, k), for any dtype. A 1-D idx (idx_1d) is
// shared by every r. out may be any strided view.
void gather_core(const Tensor& out, const Tensor& x, const Tensor& idx, std::int64_t d,
                 const Shape& rest, std::int64_t k, bool idx_1d) {
  if (skip_compute(out)) return;
  const Split so = split_strides(out, d), sx = split_strides(x, d);
  const Split si = idx_1d ? Split{Shape(rest.size(), 0), 1} : split_strides(idx, d);
  const std::int64_t* pi = idx.data<std::int64_t>();
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* po = static_cast<T*>(out.raw_data());
    const T* px = static_cast<const T*>(x.raw_data());
    const std::array<const Shape*, 3> st{&so.rest, &sx.rest, &si.rest};
    for_each_chunked_run<3>(rest, st, grain_for(k), [&](const auto& off, std::int64_t len,
                                                         const auto& inner) {
      for (std::int64_t j = 0; j < k; ++j) {
        T* o = po + off[0] + j * so.along;
        const T* xr = px + off[1];
        const std::int64_t* ir = pi + off[2] + j * si.along;
        for (std::int64_t i = 0; i < len; ++i)
          o[i * inner[0]] = xr[i * inner[1] + ir[i * inner[2]] * sx.along];
      }
    });
  });
}

// out[r, idx[r, j]] += src[r, j] over rest positions r and j in [0, k), in
// f32 (out is f32). Each output element is owned by one rest position and
// receives its additions in increasing j: deterministic for any thread count.
void scatter_add_core(const Tensor& out, const Tensor& src, const Tensor& idx, std::int64_t d,
                      const Shape& rest, std::int64_t k, bool idx_1d) {
  NoGradGuard ng;
  Tensor sf = src.dtype() == DType::f32 ? src.detach() : src.detach().to(DType::f32);
  if (skip_compute(out)) return;
  const Split so = split_strides(out, d), ss = split_strides(sf, d);
  const Split si = idx_1d ? Split{Shape(rest.size(), 0), 1} : split_strides(idx, d);
  const std::int64_t* pi = idx.data<std::int64_t>();
  float* po = out.data<float>();
  const float* ps = sf.data<float>();
  const std::array<const Shape*, 3> st{&so.rest, &ss.rest, &si.rest};
  for_each_chunked_run<3>(rest, st, grain_for(k), [&](const auto& off, std::int64_t len,
                                                       const auto& inner) {
    float* o = po + off[0];
    for (std::int64_t j = 0; j < k; ++j) {
      const float* s = ps + off[1] + j * ss.along;
      const std::int64_t* ir = pi + off[2] + j * si.along;
      for (std::int64_t i = 0; i < len; ++i) o[i * inner[0] + ir[i * inner[2]] * so.along] += s[i * inner[1]];
    }
  });
}

// A fresh contiguous f32 copy of x.
Tensor f32_copy(const Tensor& x) {
  Tensor out = empty(x.sizes(), DType::f32);
  if (!skip_compute(out)) detail::copy_cpu(out, x.detach());
  return out;
}

// Throws unless x has at least one dim; returns the wrapped dim.
std::int64_t checked_dim(const char* op, const Tensor& x, std::int64_t dim) {
  REMAT_CHECK(x.dim() >= 1, ShapeError, op, ": input must have at least one dim, got ",
              describe(x));
  return wrap_dim(dim, x.dim(), op);
}

// Throws unless `index` is on x's device.
void check_index_device(const char* op, const Tensor& index, const Tensor& x) {
  REMAT_CHECK(index.device() == x.device(), DeviceError, op, ": index ", describe(index),
              " and input ", describe(x), " must be on one device");
}

void check_1d_index(const char* op, const Tensor& index, const Tensor& x) {
  check_index(op, index, "index");
  check_index_device(op, index, x);
  REMAT_CHECK(index.dim() <= 1, ShapeError, op, ": index must be 1-D, got ", describe(index));
}

// Checks the shapes of gather / scatter_add: index has x's ndim and fits in
// x outside `d` (and in src everywhere when src is given).
void check_scatter_shapes(const char* op, const Tensor& x, std::int64_t d, const Tensor& index,
                          const Tensor* src) {
  check_index(op, index, "index");
  check_index_device(op, index, x);
  REMAT_CHECK(index.dim() == x.dim(), ShapeError, op, ": index ", describe(index),
              " must have as many dims as the input ", describe(x));
  if (src)
    REMAT_CHECK(src->dim() == x.dim(), ShapeError, op, ": src ", describe(*src),
                " must have as many dims as the input ", describe(x));
  for (std::int64_t k = 0; k < x.dim(); ++k) {
    REMAT_CHECK(k == d || index.size(k) <= x.size(k), ShapeError, op, ": index ",
                describe(index), " is larger than the input ", describe(x), " in dim ", k,
                " (only dim ", d, " may be larger)");
    if (src)
      REMAT_CHECK(index.size(k) <= src->size(k), ShapeError, op, ": index ", describe(index),
                  " is larger than src ", describe(*src), " in dim ", k);
  }
}

// ---------------------------------------------------------------------------
// CPU kernels (gathers copy any dtype; scatter-adds sum in f32)

// The index as the CPU kernels read it: the checked host copy, or index itself.
Tensor cpu_index(const Tensor& index, const Tensor& host) { return host.defined() ? host : host_index(index); }

void select_cpu(Tensor& out, const Tensor& x, const Tensor& index, const Tensor& host, std::int64_t d) {
  const Tensor idx = cpu_index(index, host);
  gather_core(out, x.detach(), idx, d, drop_dim(out.sizes(), d), idx.numel(), true);
}

void gather_cpu(Tensor& out, const Tensor& x, const Tensor& index, const Tensor& host, std::int64_t d) {
  const Tensor idx = cpu_index(index, host);
  gather_core(out, x.detach(), idx, d, drop_dim(idx.sizes(), d), idx.size(d), false);
}

Tensor index_add_cpu(const Tensor& x, const Tensor& src, const Tensor& index, const Tensor& host, std::int64_t d) {
  const Tensor idx = cpu_index(index, host);
  Tensor acc = f32_copy(x);
  scatter_add_core(acc, src, idx, d, drop_dim(x.sizes(), d), idx.numel(), true);
  return acc;
}

Tensor scatter_add_cpu(const Tensor& x, const Tensor& src, const Tensor& index, const Tensor& host, std::int64_t d) {
  const Tensor idx = cpu_index(index, host);
  Tensor acc = f32_copy(x);
  scatter_add_core(acc, src, idx, d, drop_dim(idx.sizes(), d), idx.size(d), false);
  return acc;
}

Tensor select_backward_cpu(const Tensor& g, const Tensor& index, const Shape& xs, std::int64_t d, DType) {
  Tensor gx = zeros(xs, DType::f32);
  const Tensor ic = host_index(index);
  scatter_add_core(gx, g, ic, d, drop_dim(xs, d), ic.numel(), true);
  return gx;
}

Tensor gather_backward_cpu(const Tensor& g, const Tensor& index, const Shape& xs, std::int64_t d, DType) {
  const Tensor ic = host_index(index);
  Tensor gx = zeros(xs, DType::f32);
  scatter_add_core(gx, g, ic, d, drop_dim(ic.sizes(), d), ic.size(d), false);
  return gx;
}

const KernelRegistration<IndexKernels> kCpu(index_kernels(), DeviceType::CPU,
                                            {select_cpu, gather_cpu, index_add_cpu, scatter_add_cpu,
                                             select_backward_cpu, gather_backward_cpu},
                                            KernelDTypes::native);

// ---------------------------------------------------------------------------
// The ops

struct IndexState {
  std::int64_t dim = 0;  // as given; the forward wraps it (negative dims count from the end)
};

// Gathers move elements; scatter-adds add one value per source element.
OpCost gather_cost(const std::vector<Tensor>& in, const IndexState&) {
  return {0, 0, 2 * double(in[1].numel()) * double(element_size(in[0].dtype()))};
}

OpCost scatter_cost(const std::vector<Tensor>& in, const IndexState&) {
  const double es = double(element_size(in[0].dtype()));
  return {0, double(in[2].numel()), (2 * double(in[0].numel()) + double(in[2].numel())) * es};
}

// index_select

void check_select(const OpDef& op, const std::vector<Tensor>& in, const IndexState& s) {
  const Tensor &x = in[0], &index = in[1];
  check_defined(op.name(), x, "input");
  checked_dim(op.name(), x, s.dim);
  check_1d_index(op.name(), index, x);
}

OpResults select(const std::vector<Tensor>& in, IndexState& s) {
  const Tensor &x = in[0], &index = in[1];
  const std::int64_t d = s.dim = wrap_dim(s.dim, x.dim(), "index_select");
  const Tensor idx = checked_index("index_select", index, x, d);
  Shape shape = x.sizes();
  shape[std::size_t(d)] = idx.numel();
  Tensor out = empty(shape, TensorOptions(x.dtype(), x.device()));
  index_kernels().run(x.device(), &IndexKernels::select, out, x, index, idx, d);
  return {{out}};
}

std::vector<Tensor> select_backward(const OpBackward<IndexState>& b) {
  return {index_kernels().run(b.grad().device(), &IndexKernels::select_backward, b.grad(), b.saved("index"),
                              b.input(0).sizes, b.state().dim, b.input(0).dtype),
          Tensor()};
}

const Op<IndexState> kIndexSelect({.name = "index_select",
                                   .inputs = {"x", "index"},
                                   .outputs = {{"out", as_computed()}},
                                   .saves = {{"index", SaveFrom::input, 1}},
                                   .summary = "entries of one dim picked by a 1-D index (any dtype)"},
                                  {.check = check_select, .forward = select, .backward = select_backward,
                                   .cost = gather_cost},
                                  &index_kernels());

// gather

void check_gather(const OpDef& op, const std::vector<Tensor>& in, const IndexState& s) {
  const Tensor &x = in[0], &index = in[1];
  check_defined(op.name(), x, "input");
  const std::int64_t d = checked_dim(op.name(), x, s.dim);
  check_scatter_shapes(op.name(), x, d, index, nullptr);
}

OpResults gather_fwd(const std::vector<Tensor>& in, IndexState& s) {
  const Tensor &x = in[0], &index = in[1];
  const std::int64_t d = s.dim = wrap_dim(s.dim, x.dim(), "gather");
  const Tensor idx = checked_index("gather", index, x, d);
  Tensor out = empty(index.sizes(), TensorOptions(x.dtype(), x.device()));
  index_kernels().run(x.device(), &IndexKernels::gather, out, x, index, idx, d);
  return {{out}};
}

std::vector<Tensor> gather_backward(const OpBackward<IndexState>& b) {
  return {index_kernels().run(b.grad().device(), &IndexKernels::gather_backward, b.grad(), b.saved("index"),
                              b.input(0).sizes, b.state().dim, b.input(0).dtype),
          Tensor()};
}

const Op<IndexState> kGather({.name = "gather",
                              .inputs = {"x", "index"},
                              .outputs = {{"out", as_computed()}},
                              .saves = {{"index", SaveFrom::input, 1}},
                              .summary = "torch.gather: x's entries picked along a dim by a full index"},
                             {.check = check_gather, .forward = gather_fwd, .backward = gather_backward,
                              .cost = gather_cost},
                             &index_kernels());

// scatter_add

void check_scatter_add(const OpDef& op, const std::vector<Tensor>& in, const IndexState& s) {
  const Tensor &x = in[0], &index = in[1], &src = in[2];
  check_floating(op.name(), x, "input");
  check_defined(op.name(), src, "src");
  check_same(op.name(), x, src);
  const std::int64_t d = checked_dim(op.name(), x, s.dim);
  check_scatter_shapes(op.name(), x, d, index, &src);
}

OpResults scatter_add_fwd(const std::vector<Tensor>& in, IndexState& s) {
  const Tensor &x = in[0], &index = in[1], &src = in[2];
  const std::int64_t d = s.dim = wrap_dim(s.dim, x.dim(), "scatter_add");
  const Tensor idx = checked_index("scatter_add", index, x, d);
  return {{index_kernels().run(x.device(), &IndexKernels::scatter_add, x, src, index, idx, d)}};
}

// dx = g; dsrc = gather(g, d, index), zero where index does not reach into src.
std::vector<Tensor> scatter_add_backward(const OpBackward<IndexState>& b) {
  const Tensor& g = b.grad();
  Tensor gsrc;
  if (b.needs(2)) {
    const Tensor& ix = b.saved("index");
    const Shape& ss = b.input(2).sizes;
    const bool full = ix.sizes() == ss;
    gsrc = full ? empty(ss, TensorOptions(g.dtype(), g.device())) : zeros(ss, TensorOptions(g.dtype(), g.device()));
    Tensor target = gsrc;
    for (std::int64_t k = 0; k < ix.dim(); ++k) target = target.narrow(k, 0, ix.size(k));
    index_kernels().run(g.device(), &IndexKernels::gather, target, g, ix, Tensor(), b.state().dim);
  }
  return {b.needs(0) ? g : Tensor(), Tensor(), gsrc};
}

const Op<IndexState> kScatterAdd({.name = "scatter_add",
                                  .inputs = {"x", "index", "src"},
                                  .outputs = {{"out"}},
                                  .saves = {{"index", SaveFrom::input, 1, inputs_mask({2})}},
                                  .summary = "a copy of x with src added at a full index's positions"},
                                 {.check = check_scatter_add, .forward = scatter_add_fwd,
                                  .backward = scatter_add_backward, .cost = scatter_cost},
                                 &index_kernels());

// index_add

void check_index_add(const OpDef& op, const std::vector<Tensor>& in, const IndexState& s) {
  const Tensor &x = in[0], &index = in[1], &src = in[2];
  check_floating(op.name(), x, "input");
  check_defined(op.name(), src, "src");
  check_same(op.name(), x, src);
  const std::int64_t d = checked_dim(op.name(), x, s.dim);
  check_1d_index(op.name(), index, x);
  Shape want = x.sizes();
  want[std::size_t(d)] = index.numel();
  REMAT_CHECK(src.sizes() == want, ShapeError, op.name(), ": src ", describe(src), " must have shape ",
              shape_str(want), " (the input ", describe(x), " with dim ", d, " of size ", index.numel(),
              ", the number of indices)");
}

OpResults index_add_fwd(const std::vector<Tensor>& in, IndexState& s) {
  const Tensor &x = in[0], &index = in[1], &src = in[2];
  const std::int64_t d = s.dim = wrap_dim(s.dim, x.dim(), "index_add");
  const Tensor idx = checked_index("index_add", index, x, d);
  return {{index_kernels().run(x.device(), &IndexKernels::index_add, x, src, index, idx, d)}};
}

// dx = g; dsrc = index_select(g, d, index).
std::vector<Tensor> index_add_backward(const OpBackward<IndexState>& b) {
  const Tensor& g = b.grad();
  Tensor gsrc;
  if (b.needs(2)) {
    const Tensor& ix = b.saved("index");
    Shape shape = g.sizes();
    shape[std::size_t(b.state().dim)] = ix.numel();
    gsrc = empty(shape, TensorOptions(g.dtype(), g.device()));
    index_kernels().run(g.device(), &IndexKernels::select, gsrc, g, ix, Tensor(), b.state().dim);
  }
  return {b.needs(0) ? g : Tensor(), Tensor(), gsrc};
}

const Op<IndexState> kIndexAdd({.name = "index_add",
                                .inputs = {"x", "index", "src"},
                                .outputs = {{"out"}},
                                .saves = {{"index", SaveFrom::input, 1, inputs_mask({2})}},
                                .summary = "a copy of x with src's slices added at a 1-D index's slices"},
                               {.check = check_index_add, .forward = index_add_fwd, .backward = index_add_backward,
                                .cost = scatter_cost},
                               &index_kernels());

}  // namespace

Tensor index_select(const Tensor& x, std::int64_t dim, const Tensor& index) {
  return kIndexSelect.call1({x, index}, {dim});
}

Tensor gather(const Tensor& x, std::int64_t dim, const Tensor& index) { return kGather.call1({x, index}, {dim}); }

Tensor scatter_add(const Tensor& x, std::int64_t dim, const Tensor& index, const Tensor& src) {
  return kScatterAdd.call1({x, index, src}, {dim});
}

Tensor index_add(const Tensor& x, std::int64_t dim, const Tensor& index, const Tensor& src) {
  return kIndexAdd.call1({x, index, src}, {dim});
}

}  // namespace remat
