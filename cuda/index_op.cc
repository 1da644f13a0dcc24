// The index ops' CUDA kernels (cuda/index.h) registered for ops/index.h,
// and the source lists the many-index scatter-adds need, built on the host.
//
// Gathers read the device index directly (any layout, i32 or i64). Scatter-
// adds are deterministic without atomics: with at most kScanMaxK indices along
// `dim` every output element scans them in order (no host work); with more,
// the destinations' source lists are built on the host (a stable sort, so each
// destination adds its sources in increasing index position, the CPU order),
// uploaded, and each destination is summed by one thread.
#include <algorithm>
#include <utility>
#include <vector>

#include "cuda/copy.h"
#include "cuda/index.h"
#include "cuda/op_util.h"
#include "cuda/runtime.h"
#include "ops/index.h"

namespace remat::cuda {

namespace {

constexpr std::int64_t kScanMaxK = 16;

// `v` as an i64 tensor on `device`.
Tensor upload(const std::vector<std::int64_t>& v, Device device) {
  Tensor t = empty({std::int64_t(v.size())}, TensorOptions(DType::i64, device));
  copy_host_to_device(t.raw_data(), v.data(), v.size() * sizeof(std::int64_t), op_stream());
  return t;
}

// The values of `index` (row-major), from its checked host copy when there is one.
std::vector<std::int64_t> index_values(const Tensor& index, const Tensor& host) {
  return host.defined() ? host.to_vector<std::int64_t>() : host_index(index).to_vector<std::int64_t>();
}

// Source lists packed as [keys (touched) | starts (touched + 1) | order].
struct Lists {
  std::vector<std::int64_t> buf;
  std::int64_t touched = 0;
};

// On meta (no index values to read): lists for `positions` index positions
// each landing on a different one of `destinations`, their largest size
// (docs/META.md's shape-only paths).
Lists meta_lists(std::int64_t positions, std::int64_t destinations) {
  Lists l;
  l.touched = std::min(positions, destinations);
  l.buf.resize(std::size_t(2 * l.touched + 1 + positions));
  return l;
}

// For a 1-D index of values in [0, n): the distinct values in increasing
// order and, for each, the positions holding it in increasing order.
Lists slice_lists(const char* op, const std::vector<std::int64_t>& iv, std::int64_t n) {
  std::vector<std::int64_t> start(std::size_t(n) + 1, 0);
  for (std::int64_t v : iv) {
    REMAT_CHECK(v >= 0 && v < n, ShapeError, op, ": index ", v, " is out of range for a dim of size ", n);
    ++start[std::size_t(v) + 1];
  }
  Lists l;
  std::vector<std::int64_t> keys, seg;
  for (std::int64_t v = 0; v < n; ++v) {
    if (start[std::size_t(v) + 1] > 0) {
      keys.push_back(v);
      seg.push_back(start[std::size_t(v)]);
    }
    start[std::size_t(v) + 1] += start[std::size_t(v)];
  }
  seg.push_back(std::int64_t(iv.size()));
  std::vector<std::int64_t> order(iv.size());
  std::vector<std::int64_t> cursor(start.begin(), start.end() - 1);
  for (std::size_t j = 0; j < iv.size(); ++j) order[std::size_t(cursor[std::size_t(iv[j])]++)] = std::int64_t(j);
  l.touched = std::int64_t(keys.size());
  l.buf = std::move(keys);
  l.buf.insert(l.buf.end(), seg.begin(), seg.end());
  l.buf.insert(l.buf.end(), order.begin(), order.end());
  return l;
}

// For a full index (shape `isizes`, values iv along `d`) scattering into an
// output with strides `ostrides`: the distinct destination offsets in
// increasing order and, for each, the index positions landing there in
// increasing (row-major) position.
Lists element_lists(const char* op, const std::vector<std::int64_t>& iv, const Shape& isizes,
                    const Shape& osizes, const Shape& ostrides, std::int64_t d) {
  const std::size_t nd = isizes.size();
  std::vector<std::pair<std::int64_t, std::int64_t>> dest(iv.size());
  Shape c(nd, 0);
  for (std::size_t p = 0; p < iv.size(); ++p) {
    const std::int64_t v = iv[p];
    REMAT_CHECK(v >= 0 && v < osizes[std::size_t(d)], ShapeError, op, ": index ", v,
                " is out of range for dim ", d, " of size ", osizes[std::size_t(d)]);
    std::int64_t off = v * ostrides[std::size_t(d)];
    for (std::size_t k = 0; k < nd; ++k)
      if (std::int64_t(k) != d) off += c[k] * ostrides[k];
    dest[p] = {off, std::int64_t(p)};
    for (std::size_t k = nd; k-- > 0;) {
      if (++c[k] < isizes[k]) break;
      c[k] = 0;
    }
  }
  std::sort(dest.begin(), dest.end());  // (offset, position) pairs are distinct
  Lists l;
  std::vector<std::int64_t> keys, seg, order;
  order.reserve(dest.size());
  for (std::size_t i = 0; i < dest.size(); ++i) {
    if (i == 0 || dest[i].first != dest[i - 1].first) {
      keys.push_back(dest[i].first);
      seg.push_back(std::int64_t(i));
    }
    order.push_back(dest[i].second);
  }
  seg.push_back(std::int64_t(dest.size()));
  l.touched = std::int64_t(keys.size());
  l.buf = std::move(keys);
  l.buf.insert(l.buf.end(), seg.begin(), seg.end());
  l.buf.insert(l.buf.end(), order.begin(), order.end());
  return l;
}

// A layout with out's sizes whose strides read a 1-D index of stride
// `istride` along `d` (0 elsewhere: every other position shares it).
Strided broadcast_index_layout(const Strided& out_l, std::int64_t d, std::int64_t istride) {
  Strided s = out_l;
  for (int k = 0; k < s.dim; ++k) s.strides[k] = 0;
  s.strides[d] = istride;
  return s;
}

std::int64_t stride_1d(const Tensor& index) { return index.dim() == 1 ? index.stride(0) : 0; }

// A fresh zero-filled tensor on a CUDA device (zeroed on the op's stream).
Tensor cuda_zeros(const Shape& sizes, DType dtype, Device device) {
  Tensor t = empty(sizes, TensorOptions(dtype, device));
  memset_async(t.raw_data(), 0, t.nbytes(), op_stream());
  return t;
}

// out (any layout, x's dtype, x's shape with index.numel() at d) =
// index_select(x, d, index) on CUDA.
void cuda_index_select(const char* op, const Tensor& out, const Tensor& x, const Tensor& index, std::int64_t d) {
  if (x.is_contiguous() && out.is_contiguous()) {
    std::int64_t outer = 1, inner = 1;
    for (std::int64_t k = 0; k < d; ++k) outer *= x.size(k);
    for (std::int64_t k = d + 1; k < x.dim(); ++k) inner *= x.size(k);
    index_select_rows(out.raw_data(), x.raw_data(), x.dtype(), index.raw_data(), index.dtype(),
                            stride_1d(index), outer, x.size(d), index.numel(), inner, op_stream());
    return;
  }
  const Strided ol = layout_of(op, out);
  gather(out.raw_data(), ol, x.raw_data(), layout_of(op, x), index.raw_data(), index.dtype(),
               broadcast_index_layout(ol, d, stride_1d(index)), x.dtype(), int(d), op_stream());
}

// out (any layout, index's shape) = gather(x, d, index) on CUDA.
void cuda_gather(const char* op, const Tensor& out, const Tensor& x, const Tensor& index, std::int64_t d) {
  gather(out.raw_data(), layout_of(op, out), x.raw_data(), layout_of(op, x), index.raw_data(),
               index.dtype(), layout_of(op, index), x.dtype(), int(d), op_stream());
}

// out[r, index[j], :] += src[r, j, :] on CUDA for a 1-D index (index_add):
// out is contiguous and holds the base values; sums in f32, one rounding.
// `host` is the index's checked host copy, if the caller has one.
void cuda_index_add(const char* op, const Tensor& out, const Tensor& src, const Tensor& index, std::int64_t d,
                    const Tensor& host) {
  const std::int64_t k = index.numel();
  if (k == 0 || out.numel() == 0) return;
  if (k <= kScanMaxK) {
    const Strided ol = layout_of(op, out);
    scatter_add_scan(out.raw_data(), out.dtype(), ol, src.raw_data(), src.dtype(), layout_of(op, src),
                           index.raw_data(), index.dtype(), broadcast_index_layout(ol, d, stride_1d(index)),
                           int(d), k, op_stream());
    return;
  }
  const Lists l = skip_compute(out) ? meta_lists(k, out.size(d)) : slice_lists(op, index_values(index, host), out.size(d));
  Tensor buf = upload(l.buf, out.device());
  const std::int64_t* pb = buf.data<std::int64_t>();
  std::int64_t outer = 1, inner = 1;
  for (std::int64_t j = 0; j < d; ++j) outer *= out.size(j);
  for (std::int64_t j = d + 1; j < out.dim(); ++j) inner *= out.size(j);
  index_add_lists(out.raw_data(), out.dtype(), outer, out.size(d), inner, src.raw_data(), src.dtype(),
                        layout_of(op, src), int(d), pb, pb + l.touched, pb + 2 * l.touched + 1, l.touched,
                        op_stream());
}

// out[r, index[r, j], ...] += src[r, j, ...] on CUDA for a full index
// (scatter_add): out is contiguous and holds the base values; sums in f32,
// one rounding. `host` is the index's checked host copy, if any.
void cuda_scatter_add(const char* op, const Tensor& out, const Tensor& src, const Tensor& index, std::int64_t d,
                      const Tensor& host) {
  const std::int64_t k = index.size(d);
  if (index.numel() == 0 || out.numel() == 0) return;
  if (k <= kScanMaxK) {
    Strided region = layout_of(op, out);
    for (int j = 0; j < region.dim; ++j)
      if (j != d) region.sizes[j] = index.size(j);
    scatter_add_scan(out.raw_data(), out.dtype(), region, src.raw_data(), src.dtype(), layout_of(op, src),
                           index.raw_data(), index.dtype(), layout_of(op, index), int(d), k, op_stream());
    return;
  }
  const Lists l = skip_compute(out) ? meta_lists(index.numel(), out.numel())
                                    : element_lists(op, index_values(index, host), index.sizes(), out.sizes(),
                                                    out.strides(), d);
  Tensor buf = upload(l.buf, out.device());
  const std::int64_t* pb = buf.data<std::int64_t>();
  Strided sl = layout_of(op, src);
  for (int j = 0; j < sl.dim; ++j) sl.sizes[j] = index.size(j);  // order positions run over index's shape
  scatter_add_lists(out.raw_data(), out.dtype(), src.raw_data(), src.dtype(), sl, pb, pb + l.touched,
                          pb + 2 * l.touched + 1, l.touched, op_stream());
}

// A contiguous copy of x in its own dtype on its CUDA device.
Tensor cuda_copy(const char* op, const Tensor& x) {
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype(), x.device()));
  copy_strided(out.raw_data(), out.dtype(), layout_of(op, out), x.raw_data(), x.dtype(), layout_of(op, x),
                     op_stream());
  return out;
}

// ---------------------------------------------------------------------------
// The kernels

void select(Tensor& out, const Tensor& x, const Tensor& index, const Tensor&, std::int64_t d) {
  cuda_index_select("index_select", out, x.detach(), index.detach(), d);
}

void gather_kernel(Tensor& out, const Tensor& x, const Tensor& index, const Tensor&, std::int64_t d) {
  cuda_gather("gather", out, x.detach(), index.detach(), d);
}

Tensor index_add(const Tensor& x, const Tensor& src, const Tensor& index, const Tensor& host, std::int64_t d) {
  Tensor out = cuda_copy("index_add", x.detach());
  cuda_index_add("index_add", out, src.detach(), index.detach(), d, host);
  return out;
}

Tensor scatter_add(const Tensor& x, const Tensor& src, const Tensor& index, const Tensor& host, std::int64_t d) {
  Tensor out = cuda_copy("scatter_add", x.detach());
  cuda_scatter_add("scatter_add", out, src.detach(), index.detach(), d, host);
  return out;
}

Tensor select_backward(const Tensor& g, const Tensor& index, const Shape& xs, std::int64_t d, DType dtype) {
  Tensor gx = cuda_zeros(xs, dtype, g.device());
  cuda_index_add("index_select backward", gx, g, index, d, Tensor());
  return gx;
}

Tensor gather_backward(const Tensor& g, const Tensor& index, const Shape& xs, std::int64_t d, DType dtype) {
  Tensor gx = cuda_zeros(xs, dtype, g.device());
  cuda_scatter_add("gather backward", gx, g, index, d, Tensor());
  return gx;
}

const KernelRegistration<IndexKernels> kCuda(index_kernels(), DeviceType::CUDA,
                                             {select, gather_kernel, index_add, scatter_add, select_backward,
                                              gather_backward},
                                             KernelDTypes::native);

}  // namespace
}  // namespace remat::cuda
