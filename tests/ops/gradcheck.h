// Helpers for op tests: finite-difference gradient checks (the public
// remat::gradcheck as a Catch2 check) and small tensor factories.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/gradcheck.h"
#include "engine/rng.h"
#include "engine/tensor.h"

namespace remat::testing {

using remat::GradcheckOptions;
using TensorFn = GradcheckFn;

// remat::gradcheck (engine/gradcheck.h) as a Catch2 check: fails the test
// case with the report of every comparison out of tolerance.
inline void check_gradients(const TensorFn& f, const std::vector<Tensor>& inputs, GradcheckOptions opt = {}) {
  const GradcheckResult r = gradcheck(f, inputs, opt);
  INFO(r.report());
  CHECK(r.ok);
}

// Bytes the saved-bytes registry attributes to `op` in report `r`.
inline std::int64_t op_bytes(const SavedBytesReport& r, const std::string& op) {
  auto it = r.bytes_by_op.find(op);
  return it == r.bytes_by_op.end() ? 0 : it->second;
}

// A random f32 tensor with values in [lo, hi).
inline Tensor uniform(const Shape& shape, double lo, double hi, std::uint64_t seed) {
  Generator g(seed);
  Tensor u = rand(shape, DType::f32, &g);
  auto v = u.to_vector<float>();
  for (auto& x : v) x = float(lo + (hi - lo) * x);
  return from_vector<float>(v, shape);
}

// A random normal f32 tensor.
inline Tensor normal(const Shape& shape, std::uint64_t seed, double scale = 1.0) {
  Generator g(seed);
  Tensor u = randn(shape, DType::f32, &g);
  auto v = u.to_vector<float>();
  for (auto& x : v) x = float(x * scale);
  return from_vector<float>(v, shape);
}

}  // namespace remat::testing
