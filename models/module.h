// Module: a node of a model's tree that owns named parameters and child
// modules. Parameter names join the path with '.', as in Hugging Face
// checkpoints ("model.layers.0.self_attn.q_proj.weight").
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace remat {

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Every parameter with its full name, depth first in registration order.
  std::vector<std::pair<std::string, Tensor>> named_parameters(const std::string& prefix = "") const;
  std::vector<Tensor> parameters() const;
  // Total number of parameter elements.
  std::int64_t num_parameters() const;
  // The parameter called `name` (full name); throws Error if there is none.
  Tensor parameter(const std::string& name) const;
  // Moves every parameter (and its gradient) to `device` in place, so the
  // layers' own handles follow. Call before training or building an optimizer.
  void to(Device device);
  // Zeroes every parameter's .grad in place (buffers stay allocated).
  void zero_grad();
  // Training mode (dropout on) or evaluation mode, for this module and its children.
  void train(bool on = true);
  bool training() const { return training_; }

 protected:
  // Registers `t` as parameter `name`: a leaf that requires grad.
  Tensor register_parameter(const std::string& name, Tensor t);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    return m;
  }

 private:
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

}  // namespace remat
