// The view algebra of Tensor: views share their base's storage and version
// counter, and each records its backward (the inverse view, a sum over
// broadcast dims, or a scatter into zeros).
#include <algorithm>

#include "engine/autograd.h"
#include "engine/tensor.h"
#include "engine/tensor_internal.h"

namespace remat {

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
  detail::check_dims(sizes, "as_strided");
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
  detail::check_dims(sizes, "view");
  Shape st;
  REMAT_CHECK(view_strides(this->sizes(), strides(), sizes, st), ShapeError, "view: a tensor of ",
              "sizes ", shape_str(this->sizes()), " and strides ", shape_str(strides()),
              " cannot be viewed as ", shape_str(sizes), "; call reshape() or contiguous() first");
  const Shape in = this->sizes();
  return detail::with_grad(*this, make_view(sizes, st, storage_offset()), "view",
                   [in](const Tensor& g) { return g.reshape(in); });
}

Tensor Tensor::reshape(const Shape& sizes_in) const {
  Shape sizes = infer_size(sizes_in, numel(), "reshape", this->sizes());
  Shape st;
  if (view_strides(this->sizes(), strides(), sizes, st)) {
    const Shape in = this->sizes();
    return detail::with_grad(*this, make_view(sizes, st, storage_offset()), "reshape",
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
  return detail::with_grad(*this, make_view(s, st, storage_offset()), "transpose",
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
  return detail::with_grad(*this, make_view(s, st, storage_offset()), "permute",
                   [inverse](const Tensor& g) { return g.permute(inverse); });
}

Tensor Tensor::narrow(std::int64_t d, std::int64_t start, std::int64_t length) const {
  d = wrap_dim(d, dim(), "narrow");
  const std::int64_t n = sizes()[std::size_t(d)];
  if (start < 0) start += n;
  std::int64_t end = 0;
  const bool overflows = __builtin_add_overflow(start, length, &end);
  REMAT_CHECK(start >= 0 && length >= 0 && !overflows && end <= n, ShapeError, "narrow: range [", start, ", ",
              overflows ? std::string("beyond 2^63") : std::to_string(end), ") is outside dim ", d, " of size ", n,
              " (shape ", shape_str(sizes()), ")");
  Shape s = sizes();
  s[std::size_t(d)] = length;
  return detail::with_view_grad(*this, make_view(s, strides(), storage_offset() + start * strides()[std::size_t(d)]),
                        "narrow", [=](const Tensor& r) { return r.narrow(d, start, length); });
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
  return detail::with_view_grad(*this, make_view(s, st, storage_offset() + start * strides()[std::size_t(d)]),
                        "slice", [=](const Tensor& r) { return r.slice(d, start, end, step); });
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
  return detail::with_view_grad(*this, make_view(s, st, storage_offset() + index * strides()[std::size_t(d)]),
                        "select", [=](const Tensor& r) { return r.select(d, index); });
}

Tensor Tensor::expand(const Shape& sizes_in) const {
  REMAT_CHECK(sizes_in.size() >= sizes().size(), ShapeError, "expand: cannot expand shape ",
              shape_str(sizes()), " to fewer dims ", shape_str(sizes_in));
  detail::check_dims(Shape(sizes_in.size(), 0), "expand");
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
  return detail::with_grad(*this, make_view(s, st, storage_offset()), "expand",
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
  return detail::with_grad(*this, make_view(s, st, storage_offset()), "squeeze",
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
  return detail::with_grad(*this, make_view(s, st, storage_offset()), "squeeze",
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
  detail::check_dims(s, "unsqueeze");
  const Shape in = sizes();
  return detail::with_grad(*this, make_view(s, st, storage_offset()), "unsqueeze",
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


}  // namespace remat
