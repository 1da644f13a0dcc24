// The gradient arithmetic the autograd engine runs itself: accumulation into
// a gradient buffer and the sum that undoes broadcasting, on the CPU and (through
// the device back end) on CUDA. Both are deterministic: fixed summation
// orders, f32 accumulation, no atomics.
#include <array>
#include <vector>

#include "engine/autograd.h"
#include "engine/device_backend.h"
#include "engine/device_layout.h"
#include "engine/meta_mirror.h"
#include "engine/op_hooks.h"
#include "engine/strided.h"

namespace remat {

// ---------------------------------------------------------------------------
// Gradient arithmetic the engine needs itself

bool detail::writable_alone(const Tensor& t) {
  if (!t.defined() || t.impl_ptr().use_count() != 1 || t.requires_grad()) return false;
  const TensorImpl& impl = t.impl();
  return impl.storage && impl.storage.use_count() == 1 && !impl.storage->external() && !impl.released &&
         t.storage_offset() == 0 && t.is_contiguous() && t.nbytes() == impl.storage->nbytes();
}

void detail::add_into(Tensor& acc, const Tensor& g) {
  REMAT_CHECK(acc.sizes() == g.sizes(), ShapeError, "gradient accumulation: shapes ",
              shape_str(acc.sizes()), " and ", shape_str(g.sizes()), " differ");
  REMAT_CHECK(acc.device() == g.device(), DeviceError, "gradient accumulation: the gradient is on ",
              g.device(), " but the buffer it adds into is on ", acc.device());
  if (runs_cuda_kernels(acc.device())) {  // (meta mirroring CUDA: CUDA's allocations, none)
    REMAT_CHECK(is_floating(acc.dtype()) && is_floating(g.dtype()), DTypeError,
                "gradient accumulation on ", acc.device(), ": expected floating dtypes, got ", acc.dtype(),
                " and ", g.dtype());
    if (acc.device().is_meta()) {
      acc.bump_version();
      return;
    }
    const ObservedWork observed("gradient accumulation", acc.device());
    detail::cuda_backend("gradient accumulation", acc.device())
        .add_into(acc.raw_data(), acc.dtype(), detail::device_layout(acc), g.raw_data(), g.dtype(),
                  detail::device_layout(g), current_stream());
    acc.bump_version();
    return;
  }
  Tensor src = g.dtype() == acc.dtype() ? g : g.to(acc.dtype());
  if (acc.device().is_meta()) {  // the CPU's temporaries, no arithmetic
    acc.bump_version();
    return;
  }
  const std::array<const Shape*, 2> st{&acc.strides(), &src.strides()};
  visit_dtype(acc.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, fp8_e4m3>) {
      throw DTypeError("gradient accumulation: unsupported dtype " + std::string(dtype_name(acc.dtype())));
    } else {
      T* a = static_cast<T*>(acc.raw_data());
      const T* b = static_cast<const T*>(src.raw_data());
      for_each_run<2>(acc.sizes(), st, [&](const auto& off, std::int64_t n, const auto& inner) {
        T* pa = a + off[0];
        const T* pb = b + off[1];
        if (inner[0] == 1 && inner[1] == 1) {
          for (std::int64_t i = 0; i < n; ++i) pa[i] = T(float(pa[i]) + float(pb[i]));
        } else {
          for (std::int64_t i = 0; i < n; ++i)
            pa[i * inner[0]] = T(float(pa[i * inner[0]]) + float(pb[i * inner[1]]));
        }
      });
    }
  });
  acc.bump_version();
}

namespace {
// sum_to_shape on CUDA: dims of g that map to an output dim (stride != 0)
// are kept, the rest are summed in input order.
Tensor sum_to_shape_cuda(const Tensor& g, const Shape& shape, const Shape& out_strides_in_g) {
  DeviceLayout kept, reduced;
  for (std::size_t d = 0; d < g.sizes().size(); ++d) {
    DeviceLayout& part = out_strides_in_g[d] != 0 ? kept : reduced;
    REMAT_CHECK(part.dim < kMaxDeviceDims, ShapeError, "sum_to_shape: too many dims for CUDA: ",
                shape_str(g.sizes()));
    part.sizes[part.dim] = g.sizes()[d];
    part.strides[part.dim] = g.strides()[d];
    ++part.dim;
  }
  // (On meta mirroring CUDA: CUDA's output and workspace, no sum.)
  DeviceBackend& backend = g.device().is_meta() ? *detail::cuda_backend_or_null()
                                                : detail::cuda_backend("sum_to_shape", g.device());
  Tensor out = empty(shape, TensorOptions(DType::f32, g.device()));
  Tensor work;
  if (const std::int64_t w = backend.sum_reduced_workspace(kept, reduced); w > 0)
    work = empty({w}, TensorOptions(DType::f32, g.device()));
  if (g.device().is_meta()) return g.dtype() == DType::f32 ? out : out.to(g.dtype());
  const ObservedWork observed("sum_to_shape", g.device());
  backend.sum_reduced(out.data<float>(), g.raw_data(), g.dtype(), kept, reduced,
                      work.defined() ? work.data<float>() : nullptr, current_stream());
  return g.dtype() == DType::f32 ? out : out.to(g.dtype());
}
}  // namespace

Tensor detail::sum_to_shape(const Tensor& g, const Shape& shape) {
  if (g.sizes() == shape) return g;
  REMAT_CHECK(g.dim() >= std::int64_t(shape.size()), ShapeError, "sum_to_shape: cannot reduce ",
              shape_str(g.sizes()), " to ", shape_str(shape));
  // Output element o sums the input elements that broadcast onto it. Loop over
  // the input in order (deterministic) accumulating in f32.
  const std::size_t lead = g.sizes().size() - shape.size();
  Shape out_strides_in_g(g.sizes().size(), 0);  // stride into the output for each g dim
  const Shape cs = contiguous_strides(shape);
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const std::int64_t gs = g.sizes()[lead + i];
    REMAT_CHECK(shape[i] == gs || shape[i] == 1, ShapeError, "sum_to_shape: cannot reduce ",
                shape_str(g.sizes()), " to ", shape_str(shape));
    out_strides_in_g[lead + i] = shape[i] == 1 ? 0 : cs[i];
  }
  if (runs_cuda_kernels(g.device())) return sum_to_shape_cuda(g, shape, out_strides_in_g);
  Tensor gf = g.dtype() == DType::f32 ? g : g.to(DType::f32);
  Tensor acc = zeros(shape, TensorOptions(DType::f32, g.device()));
  if (g.device().is_meta()) return g.dtype() == DType::f32 ? acc : acc.to(g.dtype());  // the CPU's allocations
  float* o = acc.data<float>();
  const float* in = gf.data<float>();
  // Serial over the input: the result must not depend on thread count.
  std::vector<std::int64_t> idx(g.sizes().size(), 0);
  const std::int64_t n = g.numel();
  const Shape& gst = gf.strides();
  std::int64_t goff = 0, ooff = 0;
  for (std::int64_t k = 0; k < n; ++k) {
    o[ooff] += in[goff];
    for (std::int64_t d = std::int64_t(idx.size()) - 1; d >= 0; --d) {
      const auto ud = std::size_t(d);
      ++idx[ud];
      goff += gst[ud];
      ooff += out_strides_in_g[ud];
      if (idx[ud] < g.sizes()[ud]) break;
      goff -= idx[ud] * gst[ud];
      ooff -= idx[ud] * out_strides_in_g[ud];
      idx[ud] = 0;
    }
  }
  return g.dtype() == DType::f32 ? acc : acc.to(g.dtype());
}

}  // namespace remat
