#include "models/module.h"

#include "engine/autograd.h"
#include "engine/grad_mode.h"

namespace remat {

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(const std::string& prefix) const {
  std::vector<std::pair<std::string, Tensor>> out;
  const std::string p = prefix.empty() ? "" : prefix + ".";
  for (const auto& [name, t] : params_) out.emplace_back(p + name, t);
  for (const auto& [name, child] : children_) {
    auto sub = child->named_parameters(p + name);
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

std::int64_t Module::num_parameters() const {
  std::int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

Tensor Module::parameter(const std::string& name) const {
  for (auto& [n, t] : named_parameters())
    if (n == name) return t;
  throw Error("no parameter named '" + name + "'");
}

void Module::to(Device device) {
  CategoryScope cat(MemoryCategory::parameter);
  for (auto& [n, t] : named_parameters()) {
    Tensor p = t;
    p.move_to_(device);
  }
}

void Module::zero_grad() {
  // Gradient buffers stay allocated (zeroed in place), so parameters,
  // gradients and optimizer state form a constant persistent footprint and
  // backward accumulates into the same memory every step.
  NoGradGuard ng;
  for (auto& [n, t] : named_parameters())
    if (Tensor g = t.grad(); g.defined()) g.zero_();
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  t.set_requires_grad(true);
  params_.emplace_back(name, t);
  return t;
}

}  // namespace remat
