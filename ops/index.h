// Indexing along one dim with integer index tensors (i32 or i64, values in
// [0, size); negative indices are rejected): index_select and gather read,
// index_add and scatter_add accumulate out of place. Accumulation adds
// repeated indices in index order, so results do not depend on thread count.
// Floating operands are differentiable; index tensors are not.
#pragma once

#include <cstdint>

#include "engine/tensor.h"
#include "ops/kernel_table.h"

namespace remat {

// Entries index[0..k) of `dim` of x (any dtype): x's shape with size k at
// `dim`. `index` is 1-D (or 0-D, one entry). Backward: index_add into zeros.
Tensor index_select(const Tensor& x, std::int64_t dim, const Tensor& index);

// torch.gather: out[i][j][k] = x[i][index[i][j][k]][k] for dim 1 (likewise for
// any dim). index has x's ndim and index.size(d) <= x.size(d) for d != dim;
// out has index's shape and x's dtype. Backward: scatter_add into zeros.
Tensor gather(const Tensor& x, std::int64_t dim, const Tensor& index);

// A copy of floating x with src added at index positions along `dim`
// (torch.scatter_add): out[i][index[i][j][k]][k] += src[i][j][k] for dim 1.
// index, src and x share ndim; index.size(d) <= src.size(d) for every d and
// <= x.size(d) for d != dim. src has x's dtype. Gradients: dx = g,
// dsrc = gather(g, dim, index) (zeros where index does not reach).
Tensor scatter_add(const Tensor& x, std::int64_t dim, const Tensor& index, const Tensor& src);

// A copy of floating x with src's slice j added to x's slice index[j] along
// `dim`. index is 1-D (or 0-D) with k entries; src has x's shape with size k
// at `dim` and x's dtype. Gradients: dx = g, dsrc = index_select(g, dim, index).
Tensor index_add(const Tensor& x, std::int64_t dim, const Tensor& index, const Tensor& src);

// The kernels a device registers for the index ops (operands in their own
// dtypes). `index` is on the operands' device (i32 or i64, values checked to
// be in range); `host` is its checked copy on the CPU (i64, contiguous) when
// the caller has one, else undefined. d is a wrapped dim.
struct IndexKernels {
  // out (x's dtype, x's shape with the index's length at d; any layout) = index_select(x, d, index).
  void (*select)(Tensor& out, const Tensor& x, const Tensor& index, const Tensor& host, std::int64_t d);
  // out (the index's shape, x's dtype; any layout) = gather(x, d, index).
  void (*gather)(Tensor& out, const Tensor& x, const Tensor& index, const Tensor& host, std::int64_t d);
  // A copy of x with src's slices added at a 1-D index's slices along d (sums in f32).
  Tensor (*index_add)(const Tensor& x, const Tensor& src, const Tensor& index, const Tensor& host, std::int64_t d);
  // A copy of x with src added at a full index's positions along d (sums in f32).
  Tensor (*scatter_add)(const Tensor& x, const Tensor& src, const Tensor& index, const Tensor& host,
                        std::int64_t d);
  // index_select's input gradient [xs]: g's slices added into zeros at the index (dtype: the input's).
  Tensor (*select_backward)(const Tensor& g, const Tensor& index, const Shape& xs, std::int64_t d, DType dtype);
  // gather's input gradient [xs]: g scatter-added into zeros at the index.
  Tensor (*gather_backward)(const Tensor& g, const Tensor& index, const Shape& xs, std::int64_t d, DType dtype);
};
KernelTable<IndexKernels>& index_kernels();

// `index` as a contiguous i64 tensor on the CPU (no copy for one already); a
// meta index stays on meta (no values: the CPU's cast and copy, shapes only).
Tensor host_index(const Tensor& index);

}  // namespace remat
