// index_select, gather, scatter_add and index_add: each op's forward and
// backward side by side, with the CPU kernels here and the CUDA launchers
// (and the host-side source lists they need) in index_cuda.cc.
#include "ops/index.h"

#include <algorithm>
#include <array>
#include <utility>

#include "cuda/runtime.h"
#include "ops/index_cuda.h"
#include "ops/kernel_util.h"

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

Tensor ops_detail::host_index(const Tensor& index) {
  NoGradGuard ng;
  if constexpr (kHaveCuda) {
    if (on_cuda(index)) {
      Tensor c = contiguous_detached(index);
      Tensor host = empty(c.sizes(), TensorOptions(c.dtype(), kCPU));
      cuda::copy_device_to_host(host.raw_data(), c.raw_data(), c.nbytes(), cuda_stream());
      return host.dtype() == DType::i64 ? host : host.to(DType::i64);
    }
  }
  Tensor ix = index.dtype() == DType::i64 ? index.detach() : index.detach().to(DType::i64);
  return ix.contiguous();
}

namespace {

// `index` as a contiguous i64 tensor on the CPU after checking every value
// lies in [0, n) (n = x.size(d)); the error names the bad index, where it is,
// and the size. On CUDA this is where the index values are validated: the
// kernels trust them.
Tensor checked_index(const char* op, const Tensor& index, const Tensor& x, std::int64_t d) {
  NoGradGuard ng;
  Tensor ix = host_index(index);
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
  const Split so = split_strides(out, d), sx = split_strides(x, d);
  const Split si = idx_1d ? Split{Shape(rest.size(), 0), 1} : split_strides(idx, d);
  const std::int64_t* pi = idx.data<std::int64_t>();
  dispatch_dtype(x.dtype(), [&](auto tag) {
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
  detail::copy_cpu(out, x.detach());
  return out;
}

// Throws unless x has at least one dim; returns the wrapped dim.
std::int64_t checked_dim(const char* op, const Tensor& x, std::int64_t dim) {
  REMAT_CHECK(x.dim() >= 1, ShapeError, op, ": input must have at least one dim, got ",
              describe(x));
  return wrap_dim(dim, x.dim(), op);
}

// Throws unless `index` is on x's device (CPU or CUDA).
void check_index_device(const char* op, const Tensor& index, const Tensor& x) {
  check_kernel_device(op, index);
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

}  // namespace

Tensor index_select(const Tensor& x, std::int64_t dim, const Tensor& index) {
  check_defined("index_select", x, "input");
  check_kernel_device("index_select", x);
  const std::int64_t d = checked_dim("index_select", x, dim);
  check_1d_index("index_select", index, x);
  return dispatch1("index_select", {x, index}, [&] {
    Tensor idx = checked_index("index_select", index, x, d);
    Shape shape = x.sizes();
    shape[std::size_t(d)] = idx.numel();
    Tensor out = empty(shape, TensorOptions(x.dtype(), x.device()));
    {
      NoGradGuard ng;
      if (on_cuda(x))
        cuda_index_select("index_select", out, x.detach(), index.detach(), d);
      else
        gather_core(out, x.detach(), idx, d, drop_dim(shape, d), idx.numel(), true);
    }
    if (auto node = autograd::make_node("index_select", {&x})) {
      node->save(index);
      node->backward_fn = [xs = x.sizes(), d, dt = x.dtype()](Node& n, std::vector<Tensor>& g) {
        Tensor ix = n.saved(0);
        if (on_cuda(g[0])) {
          Tensor gx = cuda_zeros(xs, dt, g[0].device());
          cuda_index_add("index_select backward", gx, g[0], ix, d, nullptr);
          return std::vector<Tensor>{gx};
        }
        Tensor gx = zeros(xs, DType::f32);
        Tensor ic = ix.dtype() == DType::i64 ? ix.contiguous() : ix.to(DType::i64).contiguous();
        scatter_add_core(gx, g[0], ic, d, drop_dim(xs, d), ic.numel(), true);
        return std::vector<Tensor>{from_f32(gx, dt)};
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

Tensor gather(const Tensor& x, std::int64_t dim, const Tensor& index) {
  check_defined("gather", x, "input");
  check_kernel_device("gather", x);
  const std::int64_t d = checked_dim("gather", x, dim);
  check_scatter_shapes("gather", x, d, index, nullptr);
  return dispatch1("gather", {x, index}, [&] {
    Tensor idx = checked_index("gather", index, x, d);
    Tensor out = empty(index.sizes(), TensorOptions(x.dtype(), x.device()));
    {
      NoGradGuard ng;
      if (on_cuda(x))
        cuda_gather("gather", out, x.detach(), index.detach(), d);
      else
        gather_core(out, x.detach(), idx, d, drop_dim(index.sizes(), d), index.size(d), false);
    }
    if (auto node = autograd::make_node("gather", {&x})) {
      node->save(index);
      node->backward_fn = [xs = x.sizes(), d, dt = x.dtype()](Node& n, std::vector<Tensor>& g) {
        Tensor ix = n.saved(0);
        if (on_cuda(g[0])) {
          Tensor gx = cuda_zeros(xs, dt, g[0].device());
          cuda_scatter_add("gather backward", gx, g[0], ix, d, nullptr);
          return std::vector<Tensor>{gx};
        }
        Tensor ic = ix.dtype() == DType::i64 ? ix.contiguous() : ix.to(DType::i64).contiguous();
        Tensor gx = zeros(xs, DType::f32);
        scatter_add_core(gx, g[0], ic, d, drop_dim(ic.sizes(), d), ic.size(d), false);
        return std::vector<Tensor>{from_f32(gx, dt)};
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

Tensor scatter_add(const Tensor& x, std::int64_t dim, const Tensor& index, const Tensor& src) {
  check_floating("scatter_add", x, "input");
  check_defined("scatter_add", src, "src");
  check_same("scatter_add", x, src);
  check_kernel_device("scatter_add", x);
  const std::int64_t d = checked_dim("scatter_add", x, dim);
  check_scatter_shapes("scatter_add", x, d, index, &src);
  return dispatch1("scatter_add", {x, index, src}, [&] {
    Tensor idx = checked_index("scatter_add", index, x, d);
    Tensor out;
    if (on_cuda(x)) {
      NoGradGuard ng;
      out = cuda_copy("scatter_add", x.detach());
      cuda_scatter_add("scatter_add", out, src.detach(), index.detach(), d, &idx);
    } else {
      Tensor acc = f32_copy(x);
      scatter_add_core(acc, src, idx, d, drop_dim(index.sizes(), d), index.size(d), false);
      NoGradGuard ng;
      out = from_f32(acc, x.dtype());
    }
    if (auto node = autograd::make_node("scatter_add", {&x, &src})) {
      node->save(node->needs_input_grad(1) ? index : Tensor());
      node->backward_fn = [d, ss = src.sizes()](Node& n, std::vector<Tensor>& g) {
        Tensor gsrc;
        if (n.needs_input_grad(1)) {
          Tensor ix = n.saved(0);
          if (on_cuda(g[0])) {
            const bool full = ix.sizes() == ss;
            gsrc = full ? empty(ss, TensorOptions(g[0].dtype(), g[0].device()))
                        : cuda_zeros(ss, g[0].dtype(), g[0].device());
            Tensor target = gsrc;
            for (std::int64_t k = 0; k < ix.dim(); ++k) target = target.narrow(k, 0, ix.size(k));
            cuda_gather("scatter_add backward", target, g[0], ix, d);
            return std::vector<Tensor>{n.needs_input_grad(0) ? g[0] : Tensor(), gsrc};
          }
          Tensor ic = ix.dtype() == DType::i64 ? ix.contiguous() : ix.to(DType::i64).contiguous();
          // dsrc = gather(g, d, index), zero where index does not reach into src.
          const bool full = ic.sizes() == ss;
          gsrc = full ? empty(ss, g[0].dtype()) : zeros(ss, g[0].dtype());
          Tensor target = gsrc;
          for (std::int64_t k = 0; k < ic.dim(); ++k) target = target.narrow(k, 0, ic.size(k));
          gather_core(target, g[0], ic, d, drop_dim(ic.sizes(), d), ic.size(d), false);
        }
        return std::vector<Tensor>{n.needs_input_grad(0) ? g[0] : Tensor(), gsrc};
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

Tensor index_add(const Tensor& x, std::int64_t dim, const Tensor& index, const Tensor& src) {
  check_floating("index_add", x, "input");
  check_defined("index_add", src, "src");
  check_same("index_add", x, src);
  check_kernel_device("index_add", x);
  const std::int64_t d = checked_dim("index_add", x, dim);
  check_1d_index("index_add", index, x);
  Shape want = x.sizes();
  want[std::size_t(d)] = index.numel();
  REMAT_CHECK(src.sizes() == want, ShapeError, "index_add: src ", describe(src),
              " must have shape ", shape_str(want), " (the input ", describe(x), " with dim ", d,
              " of size ", index.numel(), ", the number of indices)");
  return dispatch1("index_add", {x, index, src}, [&] {
    Tensor idx = checked_index("index_add", index, x, d);
    Tensor out;
    if (on_cuda(x)) {
      NoGradGuard ng;
      out = cuda_copy("index_add", x.detach());
      cuda_index_add("index_add", out, src.detach(), index.detach(), d, &idx);
    } else {
      Tensor acc = f32_copy(x);
      scatter_add_core(acc, src, idx, d, drop_dim(x.sizes(), d), idx.numel(), true);
      NoGradGuard ng;
      out = from_f32(acc, x.dtype());
    }
    if (auto node = autograd::make_node("index_add", {&x, &src})) {
      node->save(node->needs_input_grad(1) ? index : Tensor());
      node->backward_fn = [d](Node& n, std::vector<Tensor>& g) {
        Tensor gsrc;
        if (n.needs_input_grad(1)) {
          Tensor ix = n.saved(0);
          if (on_cuda(g[0])) {
            Shape shape = g[0].sizes();
            shape[std::size_t(d)] = ix.numel();
            gsrc = empty(shape, TensorOptions(g[0].dtype(), g[0].device()));
            cuda_index_select("index_add backward", gsrc, g[0], ix, d);
            return std::vector<Tensor>{n.needs_input_grad(0) ? g[0] : Tensor(), gsrc};
          }
          Tensor ic = ix.dtype() == DType::i64 ? ix.contiguous() : ix.to(DType::i64).contiguous();
          Shape shape = g[0].sizes();
          shape[std::size_t(d)] = ic.numel();
          gsrc = empty(shape, g[0].dtype());
          gather_core(gsrc, g[0], ic, d, drop_dim(shape, d), ic.numel(), true);
        }
        return std::vector<Tensor>{n.needs_input_grad(0) ? g[0] : Tensor(), gsrc};
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

}  // namespace remat
