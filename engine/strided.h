// Iteration over the elements of strided tensors: the one loop that copies,
// casts and fills are built on. The innermost dim runs as a plain loop; outer
// dims are split across threads when the work is large.
#pragma once

#include <array>
#include <cstdint>

#include "engine/parallel_for.h"
#include "engine/shape.h"

namespace remat::detail {

// Calls fn(offsets, n, inner_strides) for every run of the innermost dim:
// offsets[k] is the element offset of operand k at the run's start, n the run
// length and inner_strides[k] operand k's stride along it. `strides[k]` has
// one entry per dim of `sizes`.
template <std::size_t K, typename Fn>
void for_each_run(const Shape& sizes, const std::array<const Shape*, K>& strides, Fn&& fn) {
  const std::int64_t nd = std::int64_t(sizes.size());
  if (shape_numel(sizes) == 0) return;
  std::array<std::int64_t, K> inner{};
  std::int64_t n = 1;
  if (nd > 0) {
    n = sizes[std::size_t(nd - 1)];
    for (std::size_t k = 0; k < K; ++k) inner[k] = (*strides[k])[std::size_t(nd - 1)];
  }
  const std::int64_t outer = nd > 0 ? shape_numel(sizes) / n : 1;
  const std::int64_t grain = std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(n, 1));
  parallel_for(0, outer, grain, [&](std::int64_t o0, std::int64_t o1) {
    // Decompose o0 into an index over the outer dims, then step it.
    std::array<std::int64_t, 16> idx{};
    std::array<std::int64_t, K> off{};
    std::int64_t rem = o0;
    for (std::int64_t d = nd - 2; d >= 0; --d) {
      idx[std::size_t(d)] = rem % sizes[std::size_t(d)];
      rem /= sizes[std::size_t(d)];
      for (std::size_t k = 0; k < K; ++k) off[k] += idx[std::size_t(d)] * (*strides[k])[std::size_t(d)];
    }
    for (std::int64_t o = o0; o < o1; ++o) {
      fn(off, n, inner);
      for (std::int64_t d = nd - 2; d >= 0; --d) {
        const auto ud = std::size_t(d);
        ++idx[ud];
        for (std::size_t k = 0; k < K; ++k) off[k] += (*strides[k])[ud];
        if (idx[ud] < sizes[ud]) break;
        for (std::size_t k = 0; k < K; ++k) off[k] -= idx[ud] * (*strides[k])[ud];
        idx[ud] = 0;
      }
    }
  });
}

}  // namespace remat::detail
