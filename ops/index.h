// Indexing along one dim with integer index tensors (i32 or i64, values in
// [0, size); negative indices are rejected): index_select and gather read,
// index_add and scatter_add accumulate out of place. Accumulation adds
// repeated indices in index order, so results do not depend on thread count.
// Floating operands are differentiable; index tensors are not.
#pragma once

#include <cstdint>

#include "engine/tensor.h"

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

}  // namespace remat
