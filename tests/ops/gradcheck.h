// Finite-difference gradient checks for op tests.
//
// check_gradients(f, inputs) makes each floating input a leaf that requires
// grad, computes L = sum(f(inputs) * R) for a fixed random R, and compares
// dL/dx from backward with central differences (L evaluated in double from
// the f32 outputs): element by element for small inputs (a random subset of
// elements for large ones), plus one random directional derivative over all
// elements. The tolerances are far tighter than any wrong backward (a missing
// term, a transposed operand, a wrong sign or factor) can meet.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/rng.h"
#include "engine/tensor.h"

namespace remat::testing {

struct GradcheckOptions {
  double eps = 1e-2;
  double atol = 2e-3;
  double rtol = 2e-2;
  std::int64_t max_elements = 64;  // per input, element-wise checks
  std::vector<bool> check;         // which inputs to check (default: floating ones)
};

using TensorFn = std::function<Tensor(const std::vector<Tensor>&)>;

inline double weighted_sum(const Tensor& out, const std::vector<float>& r) {
  const auto v = out.to(DType::f32).to_vector<float>();
  double s = 0;
  for (std::size_t i = 0; i < v.size(); ++i) s += double(v[i]) * double(r[i]);
  return s;
}

// Evaluates f with input `which` replaced by `x` (no grad).
inline double loss_at(const TensorFn& f, std::vector<Tensor> inputs, std::size_t which,
                      const Tensor& x, const std::vector<float>& r) {
  NoGradGuard ng;
  inputs[which] = x;
  return weighted_sum(f(inputs), r);
}

inline void check_gradients(const TensorFn& f, std::vector<Tensor> inputs,
                            GradcheckOptions opt = {}) {
  std::vector<bool> check = opt.check;
  if (check.empty())
    for (const auto& t : inputs) check.push_back(t.defined() && is_floating(t.dtype()));
  // Leaves that require grad (fresh, so earlier tests do not interfere).
  std::vector<Tensor> leaves;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    Tensor t = inputs[i].defined() ? inputs[i].detach() : inputs[i];
    if (check[i]) t.set_requires_grad(true);
    leaves.push_back(t);
  }
  Tensor out = f(leaves);
  Generator gen(987654321);
  Tensor rt = randn(out.sizes(), DType::f32, &gen);
  const std::vector<float> r = rt.to_vector<float>();
  REQUIRE(out.requires_grad());
  backward({out}, {rt.to(out.dtype())});

  for (std::size_t i = 0; i < leaves.size(); ++i) {
    if (!check[i]) continue;
    INFO("input " << i << " of shape " << shape_str(leaves[i].sizes()));
    Tensor g = leaves[i].grad();
    REQUIRE(g.defined());
    REQUIRE(g.sizes() == leaves[i].sizes());
    const auto ga = g.to(DType::f32).contiguous().to_vector<float>();
    Tensor base = leaves[i].detach().contiguous();
    const std::int64_t n = base.numel();
    // Element-wise checks (a deterministic subset for large inputs).
    std::vector<std::int64_t> idx;
    if (n <= opt.max_elements) {
      for (std::int64_t k = 0; k < n; ++k) idx.push_back(k);
    } else {
      for (std::int64_t k = 0; k < opt.max_elements; ++k) idx.push_back((k * 7919) % n);
    }
    for (std::int64_t k : idx) {
      Tensor xp = base.clone(), xm = base.clone();
      Tensor fp = xp.view({-1}), fm = xm.view({-1});
      const double v = base.view({-1}).at({k});
      fp.set({k}, v + opt.eps);
      fm.set({k}, v - opt.eps);
      const double num = (loss_at(f, leaves, i, xp, r) - loss_at(f, leaves, i, xm, r)) / (2 * opt.eps);
      const double ana = ga[std::size_t(k)];
      INFO("element " << k << ": numeric " << num << " analytic " << ana);
      CHECK(std::abs(num - ana) <= opt.atol + opt.rtol * std::max(std::abs(num), std::abs(ana)));
    }
    // One directional derivative over every element.
    Generator dgen(1234 + i);
    Tensor dir = randn(base.sizes(), DType::f32, &dgen);
    const auto dv = dir.to_vector<float>();
    double ana = 0;
    for (std::size_t k = 0; k < dv.size(); ++k) ana += double(dv[k]) * ga[k];
    Tensor xp, xm;
    {
      NoGradGuard ng;
      Tensor bf = base.to(DType::f32);
      Tensor step = dir;
      auto bv = bf.to_vector<float>();
      std::vector<float> pv(bv.size()), mv(bv.size());
      for (std::size_t k = 0; k < bv.size(); ++k) {
        pv[k] = float(bv[k] + opt.eps * dv[k]);
        mv[k] = float(bv[k] - opt.eps * dv[k]);
      }
      xp = from_vector<float>(pv, base.sizes()).to(base.dtype());
      xm = from_vector<float>(mv, base.sizes()).to(base.dtype());
    }
    const double num = (loss_at(f, leaves, i, xp, r) - loss_at(f, leaves, i, xm, r)) / (2 * opt.eps);
    INFO("directional derivative: numeric " << num << " analytic " << ana);
    CHECK(std::abs(num - ana) <= 4 * opt.atol + opt.rtol * std::max(std::abs(num), std::abs(ana)));
  }
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
