// The multi-tensor AdamW, gradient-norm and clipping kernels (cuda/adamw)
// behind train/optimizer against the CPU optimizer: the same parameters and
// gradients on both devices, several steps, odd sizes (not multiples of the
// vector width or of a chunk), a parameter that is not 16-byte aligned, an
// empty one and one without a gradient.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/autograd.h"
#include "engine/tensor.h"
#include "ops/ops.h"
#include "tests/cuda/device_compare.h"
#include "train/optimizer.h"

using namespace remat;
using remat::testing::check_close;
using remat::testing::DeviceTolerance;
using remat::testing::same_bits;

namespace {

constexpr DeviceTolerance kTight{1e-6, 1e-9};

// 16385 and 5 * 3 * 2111 = 31665 elements cross chunk boundaries (16384).
const std::vector<Shape> kShapes = {{7}, {33, 17}, {1, 16385}, {5, 3, 2111}, {0, 4}, {3}, {2, 5}};

struct ParamSet {
  std::vector<std::pair<std::string, Tensor>> named;
  std::vector<Tensor> params;
};

// The same parameters on `device`, from one CPU draw. The last is a view at
// element offset 1 of a larger buffer (its data is not 16-byte aligned).
ParamSet make_params(Device device) {
  Generator gen(11);
  ParamSet s;
  for (std::size_t i = 0; i < kShapes.size(); ++i)
    s.named.emplace_back("p" + std::to_string(i), randn(kShapes[i], {}, &gen).to(device).detach());
  Tensor base = randn({1001}, {}, &gen).to(device);
  s.named.emplace_back("unaligned", base.narrow(0, 1, 1000).detach());
  for (auto& [name, p] : s.named) {
    p.set_requires_grad(true);
    s.params.push_back(p);
  }
  return s;
}

// Step `step`'s gradients (the same values on both devices); the parameter
// "p6" never gets one.
void set_grads(const ParamSet& s, int step) {
  Generator gen(std::uint64_t(100 + step));
  for (const auto& [name, p] : s.named) {
    Tensor g = randn(p.sizes(), {}, &gen);
    if (name == "p6") continue;
    p.set_grad(g.to(p.device()));
  }
}

// The parameters, then the optimizer state, after `steps` AdamW steps.
std::vector<std::pair<std::string, Tensor>> run_adamw(Device device, int steps) {
  ParamSet s = make_params(device);
  AdamWOptions o;
  o.weight_decay = 0.1;
  AdamW opt(s.named, o);
  for (int k = 0; k < steps; ++k) {
    set_grads(s, k);
    opt.step(1e-2 * double(k + 1));
  }
  auto out = s.named;
  for (auto& t : opt.state()) out.push_back(t);
  return out;
}

// Gradients on `device`: the parameter set's plus one of 1001000 elements (62
// chunks, so the final sum adds many partials).
std::vector<Tensor> norm_params(Device device) {
  ParamSet s = make_params(device);
  set_grads(s, 0);
  Generator gen(5);
  Tensor big = randn({1000, 1001}, {}, &gen).to(device).detach();
  big.set_requires_grad(true);
  big.set_grad(mul(randn({1000, 1001}, {}, &gen), 0.01).to(device));
  std::vector<Tensor> out = s.params;
  out.push_back(big);
  return out;
}

}  // namespace

TEST_CASE("AdamW on CUDA updates parameters and state exactly as on the CPU", "[cuda][adamw]") {
  const auto cpu = run_adamw(kCPU, 4);
  const auto dev = run_adamw(cuda_device(0), 4);
  REQUIRE(cpu.size() == dev.size());
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    INFO(cpu[i].first);
    CHECK(dev[i].second.device().is_cuda());
    check_close(cpu[i].first, cpu[i].second, dev[i].second, kTight);
    // Same operations in the same order, nothing fused: the same bits.
    CHECK(same_bits(cpu[i].second, dev[i].second));
  }
}

TEST_CASE("AdamW on CUDA gives the same bits every run", "[cuda][adamw]") {
  const auto a = run_adamw(cuda_device(0), 3);
  const auto b = run_adamw(cuda_device(0), 3);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].first);
    CHECK(same_bits(a[i].second, b[i].second));
  }
}

TEST_CASE("AdamW on CUDA leaves a parameter without a gradient alone", "[cuda][adamw]") {
  ParamSet s = make_params(cuda_device(0));
  const Tensor untouched = s.named[6].second.detach().clone();
  const Tensor updated = s.named[0].second.detach().clone();
  AdamW opt(s.named);
  set_grads(s, 0);
  opt.step(0.1);
  CHECK(same_bits(untouched, s.named[6].second));
  CHECK(!same_bits(updated, s.named[0].second));
}

TEST_CASE("AdamW state of CUDA parameters saves and loads", "[cuda][adamw]") {
  ParamSet s = make_params(cuda_device(0));
  AdamW opt(s.named);
  set_grads(s, 0);
  opt.step(0.1);
  std::map<std::string, Tensor> saved;
  for (auto& [name, t] : opt.state()) {
    CHECK(t.device().is_cuda());
    saved[name] = t.to(kCPU).clone();
  }
  ParamSet s2 = make_params(cuda_device(0));
  AdamW opt2(s2.named);
  opt2.load_state(saved, opt.steps());
  for (auto& [name, t] : opt2.state()) {
    INFO(name);
    CHECK(t.device().is_cuda());
    CHECK(same_bits(saved.at(name), t.to(kCPU)));
  }
}

TEST_CASE("the gradient norm and clipping on CUDA match the CPU", "[cuda][adamw]") {
  const std::vector<Tensor> cpu = norm_params(kCPU);
  const std::vector<Tensor> dev = norm_params(cuda_device(0));
  const double sq_cpu = grad_sq_sum(cpu), sq_dev = grad_sq_sum(dev);
  CHECK(sq_cpu > 0);
  CHECK(std::fabs(sq_dev - sq_cpu) <= 1e-6 * sq_cpu);
  // Fixed-order reductions: the same bits every time.
  CHECK(grad_sq_sum(dev) == sq_dev);
  CHECK(grad_sq_sum(norm_params(cuda_device(0))) == sq_dev);

  // No clipping below the limit: the gradients stay as they are.
  const double loose = std::sqrt(sq_cpu) * 2;
  CHECK(std::fabs(clip_grad_norm(dev, loose) - std::sqrt(sq_cpu)) <= 1e-6 * std::sqrt(sq_cpu));
  const std::vector<Tensor> fresh = norm_params(cuda_device(0));
  for (std::size_t i = 0; i < dev.size(); ++i)
    if (dev[i].grad().defined()) CHECK(same_bits(dev[i].grad(), fresh[i].grad()));

  // Clipping to 1: the same norm before scaling, the same scaled gradients.
  const double n_cpu = clip_grad_norm(cpu, 1.0), n_dev = clip_grad_norm(dev, 1.0);
  CHECK(std::fabs(n_dev - n_cpu) <= 1e-6 * n_cpu);
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    INFO("parameter " << i);
    REQUIRE(cpu[i].grad().defined() == dev[i].grad().defined());
    if (cpu[i].grad().defined()) check_close("clipped gradient", cpu[i].grad(), dev[i].grad(), kTight);
  }
  CHECK(std::sqrt(grad_sq_sum(dev)) == Approx(1.0).epsilon(1e-5));
}

TEST_CASE("the CUDA sum of squares does not depend on alignment", "[cuda][adamw]") {
  Generator gen(9);
  const Device dev = cuda_device(0);
  Tensor g = randn({4099}, {}, &gen).to(dev);
  Tensor a = zeros({4099}, dev);
  a.set_requires_grad(true);
  a.set_grad(g.clone());
  Tensor base = zeros({4100}, dev);
  Tensor shifted = base.narrow(0, 1, 4099);
  shifted.copy_(g);
  Tensor u = zeros({4099}, dev);
  u.set_requires_grad(true);
  u.set_grad(shifted);
  const double sa = grad_sq_sum({a}), su = grad_sq_sum({u});
  CHECK(sa == su);
  const auto host = g.to_vector<float>();
  double ref = 0;
  for (float v : host) ref += double(v) * double(v);
  CHECK(std::fabs(sa - ref) <= 1e-12 * ref);
}
