// Runs an op on the CPU and on CUDA device 0 from the same inputs, forward
// and backward, and compares the outputs and the input gradients.
//
// compare_on_cuda(f, inputs, tol) makes every floating input a leaf that
// requires grad on both devices, computes y = f(inputs), seeds backward with
// the same random upstream gradient, and checks |cuda - cpu| <= atol + rtol *
// |cpu| element by element for y and every input gradient.
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

// The device the compared ops run on.
inline const Device kGpu = cuda_device(0);

// Standard normal values of shape s from Generator(seed), in dtype t (drawn on
// the CPU, so both sides of a comparison start from the same bits).
inline Tensor random_normal(const Shape& s, std::uint64_t seed, DType t = DType::f32) {
  Generator g(seed);
  return randn(s, {}, &g).to(t);
}

struct DeviceTolerance {
  double rtol = 1e-5;
  double atol = 1e-6;
};

// Tolerances for 16-bit compute (one bf16 rounding of an f32-accumulated
// result differs by at most one ulp: 2^-8 relative).
inline constexpr DeviceTolerance kBf16Tolerance{1e-2, 1e-2};

using DeviceFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Element-wise |b - a| <= atol + rtol * |a|, reporting the worst element.
inline void check_close(const std::string& what, const Tensor& cpu, const Tensor& dev,
                        DeviceTolerance tol) {
  INFO(what);
  REQUIRE(cpu.defined() == dev.defined());
  if (!cpu.defined()) return;
  REQUIRE(cpu.sizes() == dev.sizes());
  CHECK(dev.device().is_cuda());
  const auto a = cpu.to(DType::f32).to_vector<float>();
  const auto b = dev.to(kCPU).to(DType::f32).to_vector<float>();
  double worst = 0;
  std::size_t worst_i = 0;
  bool ok = true;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double err = std::fabs(double(b[i]) - double(a[i]));
    const double allowed = tol.atol + tol.rtol * std::fabs(double(a[i]));
    const bool bad = !(err <= allowed);  // NaN fails
    if (bad && ok) worst_i = i;
    if (bad) ok = false;
    if (err > worst) worst = err;
  }
  INFO("max |cuda - cpu| = " << worst << "; first failing element " << worst_i << ": cpu "
                             << (a.empty() ? 0.f : a[worst_i]) << " cuda "
                             << (b.empty() ? 0.f : b[worst_i]));
  CHECK(ok);
}

// Bit-for-bit equality of two CUDA (or CPU) tensors.
inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.sizes() == b.sizes() && a.dtype() == b.dtype() &&
         a.to(kCPU).to(DType::f32).to_vector<float>() == b.to(kCPU).to(DType::f32).to_vector<float>();
}

inline void compare_on_cuda(const DeviceFn& f, const std::vector<Tensor>& inputs,
                            DeviceTolerance tol = {}) {
  std::vector<Tensor> cpu, dev;
  for (const auto& t : inputs) {
    if (!t.defined()) {
      cpu.push_back(t);
      dev.push_back(t);
      continue;
    }
    Tensor c = t.detach().contiguous();
    Tensor d = c.to(cuda_device(0));
    if (is_floating(t.dtype())) {
      c.set_requires_grad(true);
      d.set_requires_grad(true);
    }
    cpu.push_back(c);
    dev.push_back(d);
  }
  Tensor yc = f(cpu);
  Tensor yd = f(dev);
  check_close("forward output", yc, yd, tol);
  if (!yc.requires_grad()) return;
  Generator gen(7);
  Tensor seed = randn(yc.sizes(), {}, &gen).to(yc.dtype());
  backward({yc}, {seed});
  backward({yd}, {seed.to(cuda_device(0))});
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (cpu[i].defined() && cpu[i].requires_grad())
      check_close("gradient of input " + std::to_string(i), cpu[i].grad(), dev[i].grad(), tol);
}

}  // namespace remat::testing
