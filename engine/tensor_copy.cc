// Copies, casts and fills of Tensor, on the CPU (strided loops over any pair
// of dtypes), between the host and a CUDA device, and on a CUDA device
// through the registered device back end (engine/device_backend.h).
#include <cmath>
#include <cstring>

#include "engine/autograd.h"
#include "engine/device_backend.h"
#include "engine/device_layout.h"
#include "engine/op_hooks.h"
#include "engine/producer_observer.h"
#include "engine/strided.h"
#include "engine/tensor.h"
#include "engine/tensor_internal.h"

namespace remat {

// ---------------------------------------------------------------------------
// Copies

DeviceLayout detail::device_layout(const Tensor& t) {
  REMAT_CHECK(t.dim() <= kMaxDeviceDims, ShapeError, "CUDA kernels take at most ", kMaxDeviceDims,
              " dims, got a tensor of shape ", shape_str(t.sizes()));
  DeviceLayout s;
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
  visit_dtype(dst.dtype(), [&](auto dtag) {
    using D = decltype(dtag);
    visit_dtype(src.dtype(), [&](auto stag) {
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
  ProducerCapture capture;  // dynamic rematerialization's record (engine/producer_observer.h)
  Tensor out = empty(sizes(), TensorOptions(dtype(), device()));
  out.copy_from(*this);
  if (capture.active())
    capture.report("clone", {*this}, {out}, false, [](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{in[0].clone()};
    });
  return detail::with_grad(*this, out, "clone", [](const Tensor& g) { return g; });
}

Tensor Tensor::to(DType t) const {
  if (t == dtype()) return *this;
  ProducerCapture capture;
  Tensor out = empty(sizes(), TensorOptions(t, device()));
  out.copy_from(*this);
  if (capture.active())
    capture.report("cast", {*this}, {out}, false, [t](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{in[0].to(t)};
    });
  const DType from = dtype();
  return detail::with_grad(*this, out, "cast", [from](const Tensor& g) { return g.to(from); });
}

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  Tensor out = empty(sizes(), TensorOptions(dtype(), d));
  out.copy_from(*this);
  const Device from = device();
  return detail::with_grad(*this, out, "to_device", [from](const Tensor& g) { return g.to(from); });
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

void Tensor::convert_(DType t) {
  if (t == dtype()) return;
  REMAT_CHECK(is_floating(t) && is_floating(dtype()), DTypeError, "convert_: a ", dtype(), " ", shape_str(sizes()),
              " tensor cannot become ", t, " (floating dtypes only)");
  REMAT_CHECK(is_leaf() && !requires_grad() && !grad().defined(), AutogradError, "convert_: the ", dtype(), " ",
              shape_str(sizes()), " tensor must be a leaf without requires_grad or a gradient (a frozen parameter)");
  if (released()) {  // (no elements here: only the dtype they will have)
    impl().dtype = t;
    return;
  }
  Tensor converted;
  {
    NoGradGuard ng;
    converted = detach().to(t);
  }
  TensorImpl& self = impl();
  self.storage = converted.impl().storage;
  self.strides = converted.impl().strides;
  self.offset = converted.impl().offset;
  self.dtype = t;
  bump_version();
}

Tensor& Tensor::copy_(const Tensor& src) {
  detail::check_inplace(*this, "copy_");
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
  if (device().is_meta()) {  // shapes only: the CPU's temporaries, no bytes (host or meta sources)
    REMAT_CHECK(src.device().is_meta() || src.device().is_cpu(), DeviceError, "copy_: from ", src.device(),
                " to meta: meta tensors take their shapes from the host (use .to(kCPU) first)");
    if (src.device().is_meta() && shares_storage_with(src) && !is_same(src)) src = src.clone();
    return;
  }
  detail::check_has_values(src, "copy to another device");
  if (device().is_cpu() && src.device().is_cpu()) {
    // Overlapping storage (e.g. x.copy_(x.t())) goes through a temporary.
    if (shares_storage_with(src) && !is_same(src)) src = src.clone();
    detail::copy_cpu(*this, src);
    return;
  }
  DeviceBackend& backend = detail::cuda_backend("copy_", device().is_cpu() ? src.device() : device());
  const ObservedWork observed("copy_", device().is_cpu() ? src.device() : device());
  const StreamId stream = current_stream();
  if (src.device().is_cpu()) {  // host -> device: bytes in the source's dtype, then convert there
    Tensor staged = src.is_contiguous() ? src : src.contiguous();
    if (is_contiguous() && staged.dtype() == dtype()) {
      backend.copy_host_to_device(raw_data(), staged.raw_data(), nbytes(), stream);
      return;
    }
    Tensor dev = empty(sizes(), TensorOptions(staged.dtype(), device()));
    backend.copy_host_to_device(dev.raw_data(), staged.raw_data(), staged.nbytes(), stream);
    copy_from(dev);
    return;
  }
  if (device().is_cpu()) {  // device -> host: contiguous bytes, then the CPU converts
    Tensor dense = src.is_contiguous() ? src : src.contiguous();
    if (is_contiguous() && dense.dtype() == dtype()) {
      backend.copy_device_to_host(raw_data(), dense.raw_data(), nbytes(), stream);
      return;
    }
    Tensor staged = empty(src.sizes(), TensorOptions(src.dtype(), kCPU));
    backend.copy_device_to_host(staged.raw_data(), dense.raw_data(), dense.nbytes(), stream);
    detail::copy_cpu(*this, staged);
    return;
  }
  REMAT_CHECK(src.device() == device(), DeviceError, "copy_: copies between two CUDA devices (",
              src.device(), " -> ", device(), ") go through the host: use .to(kCPU) first");
  if (shares_storage_with(src) && !is_same(src)) src = src.clone();
  backend.copy_strided(raw_data(), dtype(), detail::device_layout(*this), src.raw_data(), src.dtype(),
                       detail::device_layout(src), stream);
}

Tensor& Tensor::fill_(double value) {
  detail::check_inplace(*this, "fill_");
  bump_version();
  if (numel() == 0 || device().is_meta()) return *this;
  if (device().is_cuda()) {
    if (!is_contiguous()) {
      Tensor dense = full(sizes(), value, TensorOptions(dtype(), device()));
      copy_from(dense);
      return *this;
    }
    DeviceBackend& backend = detail::cuda_backend("fill_", device());
    const ObservedWork observed("fill_", device());
    if (value == 0.0 && !std::signbit(value))  // -0.0 is not all zero bits
      backend.memset(raw_data(), 0, nbytes(), current_stream());
    else
      backend.fill(raw_data(), dtype(), numel(), value, current_stream());
    return *this;
  }
  visit_dtype(dtype(), [&](auto tag) {
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


}  // namespace remat
