#include "engine/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "cuda/copy.h"
#include "engine/cuda_layout.h"
#include "cuda/runtime.h"
#include "cuda/stream.h"
#include "engine/autograd.h"
#include "engine/strided.h"

namespace remat {

namespace {
constexpr std::int64_t kMaxDims = 16;

void check_dims(const Shape& sizes, const char* op) {
  REMAT_CHECK(std::int64_t(sizes.size()) <= kMaxDims, ShapeError, op, ": ", sizes.size(),
              " dims requested; at most ", kMaxDims, " are supported");
  for (auto s : sizes)
    REMAT_CHECK(s >= 0, ShapeError, op, ": negative size in ", shape_str(sizes));
}
// Records `out` as produced from `input` by a one-input op whose backward is
// `bw` (a function of the output gradient), when autograd needs it.
Tensor with_grad(const Tensor& input, Tensor out, const char* name,
                 std::function<Tensor(const Tensor&)> bw) {
  if (auto node = autograd::make_node(name, {&input})) {
    node->backward_fn = [bw = std::move(bw)](Node&, std::vector<Tensor>& g) {
      return std::vector<Tensor>{bw(g[0])};
    };
    autograd::set_history(out, node);
  }
  return out;
}

// The gradient of a view that picks part of an input of shape `sizes`: zeros
// with `g` written where `pick` selects.
Tensor scatter_view_grad(const Tensor& g, const Shape& sizes, DType dtype,
                         const std::function<Tensor(const Tensor&)>& pick) {
  Tensor r = zeros(sizes, TensorOptions(dtype, g.device()));
  Tensor dst = pick(r);
  dst.copy_(g);
  return r;
}
}  // namespace

// ---------------------------------------------------------------------------
// Storage

Storage::Storage(std::size_t nbytes, Device device)
    : data_(allocator_for(device).allocate(nbytes, device.is_cuda() ? cuda::current_stream() : 0)),
      nbytes_(nbytes),
      device_(device),
      category_(current_category()) {}

// ---------------------------------------------------------------------------
// Basic queries

std::int64_t Tensor::size(std::int64_t d) const {
  return impl().sizes[std::size_t(wrap_dim(d, dim(), "size"))];
}

std::int64_t Tensor::stride(std::int64_t d) const {
  return impl().strides[std::size_t(wrap_dim(d, dim(), "stride"))];
}

bool Tensor::is_contiguous() const {
  const auto& s = impl().sizes;
  const auto& st = impl().strides;
  std::int64_t expected = 1;
  for (std::size_t i = s.size(); i-- > 0;) {
    if (s[i] == 1) continue;
    if (st[i] != expected) return false;
    expected *= s[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  const auto& im = impl();
  if (!im.storage || !im.storage->data()) return nullptr;
  return static_cast<char*>(im.storage->data()) + im.offset * std::int64_t(element_size(im.dtype));
}

// ---------------------------------------------------------------------------
// Views

Tensor Tensor::make_view(Shape sizes, Shape strides, std::int64_t offset) const {
  auto v = std::make_shared<TensorImpl>();
  v->storage = impl().storage;
  v->sizes = std::move(sizes);
  v->strides = std::move(strides);
  v->offset = offset;
  v->dtype = impl().dtype;
  v->version = impl().version;
  return Tensor(std::move(v));
}

Tensor Tensor::as_strided(const Shape& sizes, const Shape& strides, std::int64_t offset) const {
  check_dims(sizes, "as_strided");
  REMAT_CHECK(sizes.size() == strides.size(), ShapeError, "as_strided: sizes ", shape_str(sizes),
              " and strides ", shape_str(strides), " differ in length");
  // The furthest element must lie inside the storage.
  std::int64_t last = offset;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) return make_view(sizes, strides, offset);
    last += (sizes[i] - 1) * strides[i];
  }
  const std::int64_t cap =
      impl().storage ? std::int64_t(impl().storage->nbytes() / element_size(dtype())) : 0;
  REMAT_CHECK(offset >= 0 && last < std::max<std::int64_t>(cap, 1), ShapeError,
              "as_strided: sizes ", shape_str(sizes), " strides ", shape_str(strides), " offset ",
              offset, " reach element ", last, " of a storage of ", cap, " elements");
  REMAT_CHECK(!(grad_enabled() && requires_grad()), AutogradError,
              "as_strided: not differentiable; use view, narrow, slice, expand or permute");
  return make_view(sizes, strides, offset);
}

namespace {
// Resolves a single -1 in `sizes` against numel; checks the product.
Shape infer_size(Shape sizes, std::int64_t numel, const char* op, const Shape& from) {
  std::int64_t known = 1;
  int infer = -1;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == -1) {
      REMAT_CHECK(infer < 0, ShapeError, op, ": only one size may be -1, got ", shape_str(sizes));
      infer = int(i);
    } else {
      REMAT_CHECK(sizes[i] >= 0, ShapeError, op, ": invalid size in ", shape_str(sizes));
      known *= sizes[i];
    }
  }
  if (infer >= 0) {
    REMAT_CHECK(known != 0 && numel % known == 0, ShapeError, op, ": cannot view ",
                shape_str(from), " (", numel, " elements) as ", shape_str(sizes));
    sizes[std::size_t(infer)] = numel / known;
  }
  REMAT_CHECK(shape_numel(sizes) == numel, ShapeError, op, ": cannot view ", shape_str(from), " (",
              numel, " elements) as ", shape_str(sizes), " (", shape_numel(sizes), " elements)");
  return sizes;
}

// Strides that let `old` (sizes, strides) be seen with `sizes`, if any: each
// group of old dims that maps onto a group of new dims must be contiguous
// within itself.
bool view_strides(const Shape& old_sizes, const Shape& old_strides, const Shape& sizes,
                  Shape& out) {
  out.assign(sizes.size(), 0);
  if (shape_numel(old_sizes) == 0 || old_sizes.empty()) {
    out = contiguous_strides(sizes);
    return true;
  }
  std::int64_t view_d = std::int64_t(sizes.size()) - 1;
  std::int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  std::int64_t tensor_numel = 1, view_numel = 1;
  for (std::int64_t d = std::int64_t(old_sizes.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_sizes[std::size_t(d)];
    if (d == 0 ||
        (old_sizes[std::size_t(d - 1)] != 1 &&
         old_strides[std::size_t(d - 1)] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || sizes[std::size_t(view_d)] == 1)) {
        out[std::size_t(view_d)] = view_numel * chunk_base_stride;
        view_numel *= sizes[std::size_t(view_d)];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = old_strides[std::size_t(d - 1)];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}
}  // namespace

Tensor Tensor::view(const Shape& sizes_in) const {
  Shape sizes = infer_size(sizes_in, numel(), "view", this->sizes());
  check_dims(sizes, "view");
  Shape st;
  REMAT_CHECK(view_strides(this->sizes(), strides(), sizes, st), ShapeError, "view: a tensor of ",
              "sizes ", shape_str(this->sizes()), " and strides ", shape_str(strides()),
              " cannot be viewed as ", shape_str(sizes), "; call reshape() or contiguous() first");
  const Shape in = this->sizes();
  return with_grad(*this, make_view(sizes, st, storage_offset()), "view",
                   [in](const Tensor& g) { return g.reshape(in); });
}

Tensor Tensor::reshape(const Shape& sizes_in) const {
  Shape sizes = infer_size(sizes_in, numel(), "reshape", this->sizes());
  Shape st;
  if (view_strides(this->sizes(), strides(), sizes, st)) {
    const Shape in = this->sizes();
    return with_grad(*this, make_view(sizes, st, storage_offset()), "reshape",
                     [in](const Tensor& g) { return g.reshape(in); });
  }
  return contiguous().view(sizes);
}

Tensor Tensor::transpose(std::int64_t d0, std::int64_t d1) const {
  d0 = wrap_dim(d0, dim(), "transpose");
  d1 = wrap_dim(d1, dim(), "transpose");
  Shape s = sizes(), st = strides();
  std::swap(s[std::size_t(d0)], s[std::size_t(d1)]);
  std::swap(st[std::size_t(d0)], st[std::size_t(d1)]);
  return with_grad(*this, make_view(s, st, storage_offset()), "transpose",
                   [d0, d1](const Tensor& g) { return g.transpose(d0, d1); });
}

Tensor Tensor::t() const {
  REMAT_CHECK(dim() == 2, ShapeError, "t: expected a 2-D tensor, got shape ", shape_str(sizes()));
  return transpose(0, 1);
}

Tensor Tensor::permute(const Shape& dims) const {
  REMAT_CHECK(std::int64_t(dims.size()) == dim(), ShapeError, "permute: got ", dims.size(),
              " dims ", shape_str(dims), " for a tensor of shape ", shape_str(sizes()));
  Shape s(dims.size()), st(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const auto d = std::size_t(wrap_dim(dims[i], dim(), "permute"));
    REMAT_CHECK(!seen[d], ShapeError, "permute: dim ", d, " repeated in ", shape_str(dims));
    seen[d] = true;
    s[i] = sizes()[d];
    st[i] = strides()[d];
  }
  Shape inverse(dims.size());
  for (std::size_t i = 0; i < dims.size(); ++i)
    inverse[std::size_t(wrap_dim(dims[i], dim(), "permute"))] = std::int64_t(i);
  return with_grad(*this, make_view(s, st, storage_offset()), "permute",
                   [inverse](const Tensor& g) { return g.permute(inverse); });
}

Tensor Tensor::narrow(std::int64_t d, std::int64_t start, std::int64_t length) const {
  d = wrap_dim(d, dim(), "narrow");
  const std::int64_t n = sizes()[std::size_t(d)];
  if (start < 0) start += n;
  REMAT_CHECK(start >= 0 && length >= 0 && start + length <= n, ShapeError, "narrow: range [",
              start, ", ", start + length, ") is outside dim ", d, " of size ", n, " (shape ",
              shape_str(sizes()), ")");
  Shape s = sizes();
  s[std::size_t(d)] = length;
  const Shape in = sizes();
  const DType dt = dtype();
  return with_grad(*this, make_view(s, strides(), storage_offset() + start * strides()[std::size_t(d)]),
                   "narrow", [=](const Tensor& g) {
                     return scatter_view_grad(g, in, dt, [=](const Tensor& r) { return r.narrow(d, start, length); });
                   });
}

Tensor Tensor::slice(std::int64_t d, std::int64_t start, std::int64_t end, std::int64_t step) const {
  d = wrap_dim(d, dim(), "slice");
  REMAT_CHECK(step >= 1, ShapeError, "slice: step must be >= 1, got ", step);
  const std::int64_t n = sizes()[std::size_t(d)];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<std::int64_t>(start, 0, n);
  end = std::clamp<std::int64_t>(end, start, n);
  Shape s = sizes(), st = strides();
  s[std::size_t(d)] = (end - start + step - 1) / step;
  st[std::size_t(d)] *= step;
  const Shape in = sizes();
  const DType dt = dtype();
  return with_grad(*this, make_view(s, st, storage_offset() + start * strides()[std::size_t(d)]),
                   "slice", [=](const Tensor& g) {
                     return scatter_view_grad(g, in, dt, [=](const Tensor& r) { return r.slice(d, start, end, step); });
                   });
}

Tensor Tensor::select(std::int64_t d, std::int64_t index) const {
  d = wrap_dim(d, dim(), "select");
  const std::int64_t n = sizes()[std::size_t(d)];
  if (index < 0) index += n;
  REMAT_CHECK(index >= 0 && index < n, ShapeError, "select: index ", index,
              " is out of range for dim ", d, " of size ", n);
  Shape s = sizes(), st = strides();
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  const Shape in = sizes();
  const DType dt = dtype();
  return with_grad(*this, make_view(s, st, storage_offset() + index * strides()[std::size_t(d)]),
                   "select", [=](const Tensor& g) {
                     return scatter_view_grad(g, in, dt, [=](const Tensor& r) { return r.select(d, index); });
                   });
}

Tensor Tensor::expand(const Shape& sizes_in) const {
  REMAT_CHECK(sizes_in.size() >= sizes().size(), ShapeError, "expand: cannot expand shape ",
              shape_str(sizes()), " to fewer dims ", shape_str(sizes_in));
  check_dims(Shape(sizes_in.size(), 0), "expand");
  const std::size_t lead = sizes_in.size() - sizes().size();
  Shape s(sizes_in.size()), st(sizes_in.size());
  for (std::size_t i = 0; i < sizes_in.size(); ++i) {
    if (i < lead) {
      REMAT_CHECK(sizes_in[i] >= 0, ShapeError, "expand: new leading dims cannot be -1 in ",
                  shape_str(sizes_in));
      s[i] = sizes_in[i];
      st[i] = 0;
      continue;
    }
    const std::int64_t cur = sizes()[i - lead];
    const std::int64_t want = sizes_in[i] == -1 ? cur : sizes_in[i];
    REMAT_CHECK(cur == want || cur == 1, ShapeError, "expand: shape ", shape_str(sizes()),
                " cannot be expanded to ", shape_str(sizes_in), " (dim ", i, ": ", cur, " -> ",
                want, "; only size-1 dims expand)");
    s[i] = want;
    st[i] = cur == want ? strides()[i - lead] : 0;
  }
  const Shape in = sizes();
  return with_grad(*this, make_view(s, st, storage_offset()), "expand",
                   [in](const Tensor& g) { return detail::sum_to_shape(g, in); });
}

Tensor Tensor::squeeze(std::int64_t d) const {
  d = wrap_dim(d, dim(), "squeeze");
  Shape s = sizes(), st = strides();
  if (s[std::size_t(d)] == 1) {
    s.erase(s.begin() + d);
    st.erase(st.begin() + d);
  }
  const Shape in = sizes();
  return with_grad(*this, make_view(s, st, storage_offset()), "squeeze",
                   [in](const Tensor& g) { return g.reshape(in); });
}

Tensor Tensor::squeeze() const {
  Shape s, st;
  for (std::size_t i = 0; i < sizes().size(); ++i) {
    if (sizes()[i] == 1) continue;
    s.push_back(sizes()[i]);
    st.push_back(strides()[i]);
  }
  const Shape in = sizes();
  return with_grad(*this, make_view(s, st, storage_offset()), "squeeze",
                   [in](const Tensor& g) { return g.reshape(in); });
}

Tensor Tensor::unsqueeze(std::int64_t d) const {
  const std::int64_t nd = dim();
  REMAT_CHECK(d >= -nd - 1 && d <= nd, ShapeError, "unsqueeze: dim ", d,
              " is out of range for a tensor of ", nd, " dims (expected ", -nd - 1, "..", nd, ")");
  if (d < 0) d += nd + 1;
  Shape s = sizes(), st = strides();
  const std::int64_t new_stride = d < nd ? st[std::size_t(d)] * s[std::size_t(d)] : 1;
  s.insert(s.begin() + d, 1);
  st.insert(st.begin() + d, new_stride);
  check_dims(s, "unsqueeze");
  const Shape in = sizes();
  return with_grad(*this, make_view(s, st, storage_offset()), "unsqueeze",
                   [in](const Tensor& g) { return g.reshape(in); });
}

Tensor Tensor::flatten(std::int64_t start, std::int64_t end) const {
  if (dim() == 0) return reshape({1});
  start = wrap_dim(start, dim(), "flatten");
  end = wrap_dim(end, dim(), "flatten");
  REMAT_CHECK(start <= end, ShapeError, "flatten: start dim ", start, " is after end dim ", end);
  Shape s(sizes().begin(), sizes().begin() + start);
  std::int64_t m = 1;
  for (std::int64_t i = start; i <= end; ++i) m *= sizes()[std::size_t(i)];
  s.push_back(m);
  s.insert(s.end(), sizes().begin() + end + 1, sizes().end());
  return reshape(s);
}

// ---------------------------------------------------------------------------
// Copies

cuda::Strided detail::cuda_layout(const Tensor& t) {
  REMAT_CHECK(t.dim() <= cuda::kMaxDims, ShapeError, "CUDA kernels take at most ", cuda::kMaxDims,
              " dims, got a tensor of shape ", shape_str(t.sizes()));
  cuda::Strided s;
  s.dim = int(t.dim());
  for (int d = 0; d < s.dim; ++d) {
    s.sizes[d] = t.sizes()[std::size_t(d)];
    s.strides[d] = t.strides()[std::size_t(d)];
  }
  return s;
}

void detail::copy_cpu(const Tensor& dst, const Tensor& src) {
  REMAT_CHECK(dst.sizes() == src.sizes(), ShapeError, "copy: shapes ", shape_str(dst.sizes()),
              " and ", shape_str(src.sizes()), " differ");
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    std::memmove(dst.raw_data(), src.raw_data(), dst.nbytes());
    return;
  }
  char* dbase = static_cast<char*>(dst.raw_data());
  const char* sbase = static_cast<const char*>(src.raw_data());
  const std::array<const Shape*, 2> strides{&dst.strides(), &src.strides()};
  dispatch_dtype(dst.dtype(), [&](auto dtag) {
    using D = decltype(dtag);
    dispatch_dtype(src.dtype(), [&](auto stag) {
      using S = decltype(stag);
      D* d = reinterpret_cast<D*>(dbase);
      const S* s = reinterpret_cast<const S*>(sbase);
      detail::for_each_run<2>(dst.sizes(), strides, [&](const auto& off, std::int64_t n,
                                                        const auto& inner) {
        D* dp = d + off[0];
        const S* sp = s + off[1];
        for (std::int64_t i = 0; i < n; ++i) {
          if constexpr (std::is_same_v<D, S>)
            dp[i * inner[0]] = sp[i * inner[1]];
          else if constexpr (std::is_same_v<D, float> && !std::is_same_v<S, bool>)
            dp[i * inner[0]] = float(sp[i * inner[1]]);
          else
            dp[i * inner[0]] = from_double<D>(to_double(sp[i * inner[1]]));
        }
      });
    });
  });
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

// Fresh copies start at version 0: filling a new tensor is not an in-place
// write anyone could have observed.
Tensor Tensor::clone() const {
  Tensor out = empty(sizes(), TensorOptions(dtype(), device()));
  out.copy_from(*this);
  return with_grad(*this, out, "clone", [](const Tensor& g) { return g; });
}

Tensor Tensor::to(DType t) const {
  if (t == dtype()) return *this;
  Tensor out = empty(sizes(), TensorOptions(t, device()));
  out.copy_from(*this);
  const DType from = dtype();
  return with_grad(*this, out, "cast", [from](const Tensor& g) { return g.to(from); });
}

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  Tensor out = empty(sizes(), TensorOptions(dtype(), d));
  out.copy_from(*this);
  const Device from = device();
  return with_grad(*this, out, "to_device", [from](const Tensor& g) { return g.to(from); });
}

void Tensor::move_to_(Device d) {
  if (d == device()) return;
  REMAT_CHECK(grad_fn() == nullptr, AutogradError, "move_to_: only leaves move in place (this tensor of shape ",
              shape_str(sizes()), " has a grad_fn); use .to(device) for computed tensors");
  Tensor moved;
  {
    NoGradGuard ng;
    moved = detach().to(d);
  }
  if (Tensor g = grad(); g.defined()) g.move_to_(d);
  TensorImpl& self = impl();
  self.storage = moved.impl().storage;
  self.strides = moved.impl().strides;
  self.offset = moved.impl().offset;
  bump_version();
}

namespace {
void check_inplace(const Tensor& self, const char* op) {
  REMAT_CHECK(!(grad_enabled() && self.requires_grad()), AutogradError, op,
              ": in-place write to a tensor of shape ", shape_str(self.sizes()),
              " that requires grad; use an out-of-place op, or no_grad for parameter updates");
}
}  // namespace

Tensor& Tensor::copy_(const Tensor& src) {
  check_inplace(*this, "copy_");
  REMAT_CHECK(!(grad_enabled() && src.defined() && src.requires_grad()), AutogradError,
              "copy_: the source requires grad but copy_ is not differentiable; use clone()");
  bump_version();
  copy_from(src);
  return *this;
}

void Tensor::copy_from(const Tensor& src_in) {
  REMAT_CHECK(src_in.defined(), Error, "copy_: source tensor is undefined");
  Tensor src = src_in.sizes() == sizes() ? src_in : src_in.expand(sizes());
  if (numel() == 0) return;
  if (device().is_cpu() && src.device().is_cpu()) {
    // Overlapping storage (e.g. x.copy_(x.t())) goes through a temporary.
    if (shares_storage_with(src) && !is_same(src)) src = src.clone();
    detail::copy_cpu(*this, src);
    return;
  }
  const StreamId stream = cuda::current_stream();
  if (src.device().is_cpu()) {  // host -> device: bytes in the source's dtype, then convert there
    Tensor staged = src.is_contiguous() ? src : src.contiguous();
    if (is_contiguous() && staged.dtype() == dtype()) {
      cuda::copy_host_to_device(raw_data(), staged.raw_data(), nbytes(), stream);
      return;
    }
    Tensor dev = empty(sizes(), TensorOptions(staged.dtype(), device()));
    cuda::copy_host_to_device(dev.raw_data(), staged.raw_data(), staged.nbytes(), stream);
    copy_from(dev);
    return;
  }
  if (device().is_cpu()) {  // device -> host: contiguous bytes, then the CPU converts
    Tensor dense = src.is_contiguous() ? src : src.contiguous();
    if (is_contiguous() && dense.dtype() == dtype()) {
      cuda::copy_device_to_host(raw_data(), dense.raw_data(), nbytes(), stream);
      return;
    }
    Tensor staged = empty(src.sizes(), TensorOptions(src.dtype(), kCPU));
    cuda::copy_device_to_host(staged.raw_data(), dense.raw_data(), dense.nbytes(), stream);
    detail::copy_cpu(*this, staged);
    return;
  }
  REMAT_CHECK(src.device() == device(), DeviceError, "copy_: copies between two CUDA devices (",
              src.device(), " -> ", device(), ") go through the host: use .to(kCPU) first");
  if (shares_storage_with(src) && !is_same(src)) src = src.clone();
  cuda::copy_strided(raw_data(), dtype(), detail::cuda_layout(*this), src.raw_data(), src.dtype(),
                     detail::cuda_layout(src), stream);
}

Tensor& Tensor::fill_(double value) {
  check_inplace(*this, "fill_");
  bump_version();
  if (numel() == 0) return *this;
  if (device().is_cuda()) {
    if (!is_contiguous()) {
      Tensor dense = full(sizes(), value, TensorOptions(dtype(), device()));
      copy_from(dense);
      return *this;
    }
    if (value == 0.0 && !std::signbit(value))  // -0.0 is not all zero bits
      cuda::memset_async(raw_data(), 0, nbytes(), cuda::current_stream());
    else
      cuda::fill(raw_data(), dtype(), numel(), value, cuda::current_stream());
    return *this;
  }
  dispatch_dtype(dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = from_double<T>(value);
    T* base = static_cast<T*>(raw_data());
    const std::array<const Shape*, 1> st{&strides()};
    detail::for_each_run<1>(sizes(), st, [&](const auto& off, std::int64_t n, const auto& inner) {
      T* p = base + off[0];
      for (std::int64_t i = 0; i < n; ++i) p[i * inner[0]] = v;
    });
  });
  return *this;
}

Tensor& Tensor::zero_() { return fill_(0.0); }

// ---------------------------------------------------------------------------
// Element access

std::int64_t Tensor::element_offset(const Shape& index, const char* op) const {
  REMAT_CHECK(std::int64_t(index.size()) == dim(), ShapeError, op, ": index ", shape_str(index),
              " has ", index.size(), " entries for a tensor of shape ", shape_str(sizes()));
  std::int64_t off = storage_offset();
  for (std::size_t i = 0; i < index.size(); ++i) {
    std::int64_t k = index[i] < 0 ? index[i] + sizes()[i] : index[i];
    REMAT_CHECK(k >= 0 && k < sizes()[i], ShapeError, op, ": index ", shape_str(index),
                " is out of range for shape ", shape_str(sizes()));
    off += k * strides()[i];
  }
  return off;
}

namespace {
double read_element(const Tensor& t, std::int64_t off) {
  const std::size_t es = element_size(t.dtype());
  alignas(8) unsigned char buf[8];
  const char* src = static_cast<const char*>(t.impl().storage->data()) + off * std::int64_t(es);
  if (t.device().is_cuda())
    cuda::copy_device_to_host(buf, src, es, cuda::current_stream());
  else
    std::memcpy(buf, src, es);
  return dispatch_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T v;
    std::memcpy(&v, buf, sizeof(T));
    return to_double(v);
  });
}
}  // namespace

double Tensor::item() const {
  REMAT_CHECK(numel() == 1, ShapeError, "item: expected a one-element tensor, got shape ",
              shape_str(sizes()));
  return read_element(*this, element_offset(Shape(std::size_t(dim()), 0), "item"));
}

double Tensor::at(const Shape& index) const { return read_element(*this, element_offset(index, "at")); }

void Tensor::set(const Shape& index, double value) {
  check_inplace(*this, "set");
  const std::int64_t off = element_offset(index, "set");
  const std::size_t es = element_size(dtype());
  char* dst = static_cast<char*>(impl().storage->data()) + off * std::int64_t(es);
  dispatch_dtype(dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = from_double<T>(value);
    if (device().is_cuda())
      cuda::copy_host_to_device(dst, &v, sizeof(T), cuda::current_stream());
    else
      std::memcpy(dst, &v, sizeof(T));
  });
  bump_version();
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = to(kCPU).to(dtype_v<T>).contiguous();
  const T* p = static_cast<const T*>(c.raw_data());
  return std::vector<T>(p, p + c.numel());
}

template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<bf16> Tensor::to_vector<bf16>() const;
template std::vector<f16> Tensor::to_vector<f16>() const;
template std::vector<std::int32_t> Tensor::to_vector<std::int32_t>() const;
template std::vector<std::int64_t> Tensor::to_vector<std::int64_t>() const;
template std::vector<bool> Tensor::to_vector<bool>() const;

// ---------------------------------------------------------------------------
// Printing

namespace {
void format_value(std::ostream& os, DType t, double v) {
  char buf[32];
  if (t == DType::boolean)
    std::snprintf(buf, sizeof buf, "%s", v != 0.0 ? "true" : "false");
  else if (!is_floating(t) && t != DType::fp8_e4m3)
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
  else
    std::snprintf(buf, sizeof buf, "%.5g", v);
  os << buf;
}

// Prints dim `d` of `c` (contiguous, CPU) starting at element `base`; dims
// longer than 2*edge+1 show `edge` items at each end.
void print_dim(std::ostream& os, const Tensor& c, std::size_t d, std::int64_t base,
               const Shape& st, int indent, std::int64_t edge) {
  const std::int64_t n = c.sizes()[d];
  os << '[';
  const bool elide = n > 2 * edge + 1;
  for (std::int64_t i = 0; i < n; ++i) {
    if (elide && i == edge) {
      os << "...";
      i = n - edge - 1;
      os << (d + 1 == c.sizes().size() ? ", " : ",\n" + std::string(std::size_t(indent + 1), ' '));
      continue;
    }
    if (d + 1 == c.sizes().size())
      format_value(os, c.dtype(), read_element(c, base + i * st[d]));
    else
      print_dim(os, c, d + 1, base + i * st[d], st, indent + 1, edge);
    if (i + 1 < n)
      os << (d + 1 == c.sizes().size() ? ", " : ",\n" + std::string(std::size_t(indent + 1), ' '));
  }
  os << ']';
}
}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "tensor(undefined)";
  Tensor c = t.to(kCPU).contiguous();
  os << "tensor(";
  if (c.dim() == 0) {
    format_value(os, c.dtype(), c.item());
  } else if (c.numel() == 0) {
    os << "[]";
  } else {
    const std::int64_t edge = c.numel() > 1000 ? 3 : 1 << 30;
    print_dim(os, c, 0, c.storage_offset(), c.strides(), 7, edge);
  }
  return os << ", shape=" << shape_str(t.sizes()) << ", dtype=" << t.dtype()
            << ", device=" << t.device() << ')';
}

// ---------------------------------------------------------------------------
// Factories

Tensor empty(const Shape& sizes, TensorOptions opts) {
  check_dims(sizes, "empty");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage =
      std::make_shared<Storage>(std::size_t(shape_numel(sizes)) * element_size(opts.dtype), opts.device);
  impl->sizes = sizes;
  impl->strides = contiguous_strides(sizes);
  impl->dtype = opts.dtype;
  impl->version = std::make_shared<VersionCounter>();
  return Tensor(std::move(impl));
}

// Factories hand out fresh tensors at version 0: filling them is not an
// in-place write anyone could have observed.
Tensor full(const Shape& sizes, double value, TensorOptions opts) {
  Tensor t = empty(sizes, opts);
  t.fill_(value);
  t.impl().version->value.store(0);
  return t;
}
Tensor zeros(const Shape& sizes, TensorOptions opts) { return full(sizes, 0.0, opts); }
Tensor ones(const Shape& sizes, TensorOptions opts) { return full(sizes, 1.0, opts); }

Tensor arange(std::int64_t end, TensorOptions opts) { return arange(0.0, double(end), 1.0, opts); }

Tensor arange(double start, double end, double step, TensorOptions opts) {
  REMAT_CHECK(step != 0.0, Error, "arange: step must be non-zero");
  const auto n = std::max<std::int64_t>(0, std::int64_t(std::ceil((end - start) / step)));
  Tensor cpu = empty({n}, TensorOptions(opts.dtype, kCPU));
  dispatch_dtype(opts.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(cpu.raw_data());
    for (std::int64_t i = 0; i < n; ++i) p[i] = from_double<T>(start + double(i) * step);
  });
  return cpu.to(opts.device);
}

template <typename T>
Tensor from_vector(const std::vector<T>& values, Shape sizes, Device device) {
  if (sizes.empty() && values.size() != 1) sizes = {std::int64_t(values.size())};
  REMAT_CHECK(shape_numel(sizes) == std::int64_t(values.size()), ShapeError, "from_vector: ",
              values.size(), " values do not fill shape ", shape_str(sizes));
  Tensor cpu = empty(sizes, TensorOptions(dtype_v<T>, kCPU));
  if constexpr (std::is_same_v<T, bool>) {
    bool* p = static_cast<bool*>(cpu.raw_data());
    for (std::size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  } else {
    if (!values.empty()) std::memcpy(cpu.raw_data(), values.data(), values.size() * sizeof(T));
  }
  return cpu.to(device);
}

template Tensor from_vector<float>(const std::vector<float>&, Shape, Device);
template Tensor from_vector<bf16>(const std::vector<bf16>&, Shape, Device);
template Tensor from_vector<f16>(const std::vector<f16>&, Shape, Device);
template Tensor from_vector<std::int32_t>(const std::vector<std::int32_t>&, Shape, Device);
template Tensor from_vector<std::int64_t>(const std::vector<std::int64_t>&, Shape, Device);
template Tensor from_vector<bool>(const std::vector<bool>&, Shape, Device);

namespace {
Tensor random_tensor(const Shape& sizes, TensorOptions opts, Generator* gen, bool normal,
                     const char* op) {
  REMAT_CHECK(is_floating(opts.dtype), DTypeError, op, ": expected a floating dtype (f32, bf16, ",
              "f16), got ", opts.dtype);
  Generator& g = gen ? *gen : default_generator(opts.device);
  const std::int64_t n = shape_numel(sizes);
  const RngState s = g.reserve(std::uint64_t(n));
  Tensor f = empty(sizes, TensorOptions(DType::f32, opts.device));
  if (opts.device.is_cpu()) {
    if (normal)
      philox_fill_normal(f.data<float>(), n, s);
    else
      philox_fill_uniform(f.data<float>(), n, s);
  } else {
    if (normal)
      cuda::philox_normal(f.data<float>(), n, s.seed, s.offset, cuda::current_stream());
    else
      cuda::philox_uniform(f.data<float>(), n, s.seed, s.offset, cuda::current_stream());
  }
  return opts.dtype == DType::f32 ? f : f.to(opts.dtype);
}
}  // namespace

Tensor randn(const Shape& sizes, TensorOptions opts, Generator* gen) {
  return random_tensor(sizes, opts, gen, true, "randn");
}

Tensor rand(const Shape& sizes, TensorOptions opts, Generator* gen) {
  return random_tensor(sizes, opts, gen, false, "rand");
}

}  // namespace remat
