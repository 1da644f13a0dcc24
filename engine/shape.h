// Shapes and strides: small helpers shared by the tensor core and the ops.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace remat {

using Shape = std::vector<std::int64_t>;

// "[2, 3, 4]".
std::string shape_str(const Shape& s);
// Product of the sizes (1 for a scalar shape []).
std::int64_t shape_numel(const Shape& s);
// Row-major strides for `s`, in elements.
Shape contiguous_strides(const Shape& s);
// Wraps a possibly negative dim into [0, ndim); throws ShapeError naming
// `op` when it is out of range.
std::int64_t wrap_dim(std::int64_t dim, std::int64_t ndim, const char* op);
// The broadcast of two shapes (numpy rules); throws ShapeError naming `op`.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace remat
