// The layout of a tensor as device kernels take it: sizes and strides (in
// elements) of up to kMaxDeviceDims dims, a plain struct passed to kernels by
// value (cuda/ calls it cuda::Strided). The engine builds one from a Tensor
// with detail::device_layout; kernels turn a linear element index into an
// element offset with offset_of (cuda/kernel_util.cuh). This header is read by
// nvcc too, so it needs nothing but <cstdint>.
#pragma once

#include <cstdint>

namespace remat {

class Tensor;

inline constexpr int kMaxDeviceDims = 8;

struct DeviceLayout {
  int dim = 0;
  std::int64_t sizes[kMaxDeviceDims] = {};
  std::int64_t strides[kMaxDeviceDims] = {};

  // Elements covered (1 for a 0-dim layout).
  constexpr std::int64_t numel() const {
    std::int64_t n = 1;
    for (int d = 0; d < dim; ++d) n *= sizes[d];
    return n;
  }
  // True if the elements are dense in row-major order.
  constexpr bool contiguous() const {
    std::int64_t expected = 1;
    for (int d = dim - 1; d >= 0; --d) {
      if (sizes[d] != 1 && strides[d] != expected) return false;
      expected *= sizes[d];
    }
    return true;
  }
};

// A row-major contiguous layout of `sizes`.
inline DeviceLayout contiguous_layout(const std::int64_t* sizes, int dim) {
  DeviceLayout s;
  s.dim = dim;
  std::int64_t st = 1;
  for (int d = dim - 1; d >= 0; --d) {
    s.sizes[d] = sizes[d];
    s.strides[d] = st;
    st *= sizes[d];
  }
  return s;
}

namespace detail {
// t's sizes and strides in elements (engine/tensor_copy.cc); throws ShapeError
// for more than kMaxDeviceDims dims.
DeviceLayout device_layout(const Tensor& t);
}  // namespace detail

}  // namespace remat
