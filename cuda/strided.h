// The layout of a tensor as CUDA kernels see it: sizes and strides (in
// elements) of up to kMaxDims dims, passed to kernels by value. Host code
// builds one from a Tensor (ops_detail::layout_of); kernels turn a linear
// element index into an element offset with offset_of.
#pragma once

#include <cstdint>

#include "engine/dtype.h"

namespace remat::cuda {

inline constexpr int kMaxDims = 8;

struct Strided {
  int dim = 0;
  std::int64_t sizes[kMaxDims] = {};
  std::int64_t strides[kMaxDims] = {};

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
inline Strided contiguous_layout(const std::int64_t* sizes, int dim) {
  Strided s;
  s.dim = dim;
  std::int64_t st = 1;
  for (int d = dim - 1; d >= 0; --d) {
    s.sizes[d] = sizes[d];
    s.strides[d] = st;
    st *= sizes[d];
  }
  return s;
}

}  // namespace remat::cuda
