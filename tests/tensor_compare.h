// How far one tensor is from a reference, for tests that compare runs
// within rounding (a parallel layout against one process).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/tensor.h"

namespace remat::test {

// True if the tensors have the same shapes and the same f32 bits, pairwise.
inline bool same_bits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].sizes() != b[i].sizes()) return false;
    const std::vector<float> x = a[i].to_vector<float>(), y = b[i].to_vector<float>();
    if (std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) != 0) return false;
  }
  return true;
}

// Both take a tensor of another shape as infinitely far (any bound fails).
// max |a - b| / max |b| over the elements (max |a - b| when b is all zeros).
inline double max_rel_diff(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes()) return INFINITY;
  const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::fabs(double(x[i]) - double(y[i])));
    scale = std::max(scale, std::fabs(double(y[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

// ||a - b|| / ||b|| (||a - b|| when b is all zeros).
inline double norm_rel_diff(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes()) return INFINITY;
  const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  double d = 0, n = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    d += (double(x[i]) - double(y[i])) * (double(x[i]) - double(y[i]));
    n += double(y[i]) * double(y[i]);
  }
  return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
}

}  // namespace remat::test
