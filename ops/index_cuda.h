// The CUDA launchers of the index ops (index_cuda.cc), called from the ops'
// CUDA branches in index.cc. Each takes tensors on one CUDA device and queues
// its kernels on the current stream; in a build without CUDA each throws
// DeviceError (unreachable: such a build has no CUDA tensors). Internal to ops/.
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace remat::ops_detail {

// `index` as a contiguous i64 tensor on the CPU (a CUDA index is copied to
// the host on the op's stream, which waits for it). Defined in index.cc.
Tensor host_index(const Tensor& index);

// A fresh zero-filled tensor on a CUDA device (zeroed on the op's stream).
Tensor cuda_zeros(const Shape& sizes, DType dtype, Device device);
// A contiguous copy of x in its own dtype on its CUDA device.
Tensor cuda_copy(const char* op, const Tensor& x);
// out (any layout, x's dtype, x's shape with index.numel() at d) =
// index_select(x, d, index).
void cuda_index_select(const char* op, const Tensor& out, const Tensor& x, const Tensor& index, std::int64_t d);
// out (any layout, index's shape) = gather(x, d, index).
void cuda_gather(const char* op, const Tensor& out, const Tensor& x, const Tensor& index, std::int64_t d);
// out[r, index[j], :] += src[r, j, :] for a 1-D index (index_add): out is
// contiguous and holds the base values; sums in f32, one rounding. `host` is
// the index's checked host copy, if the caller has one.
void cuda_index_add(const char* op, const Tensor& out, const Tensor& src, const Tensor& index, std::int64_t d,
                    const Tensor* host);
// out[r, index[r, j], ...] += src[r, j, ...] for a full index (scatter_add):
// out is contiguous and holds the base values; sums in f32, one rounding.
// `host` is the index's checked host copy, if any.
void cuda_scatter_add(const char* op, const Tensor& out, const Tensor& src, const Tensor& index, std::int64_t d,
                      const Tensor* host);

}  // namespace remat::ops_detail
