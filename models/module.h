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
  // Every module of the tree with its full name ("" for this one), depth
  // first in registration order, this one first.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules(const std::string& prefix = "") const;
  // The parameters that require grad (the ones an optimizer updates).
  std::vector<std::pair<std::string, Tensor>> trainable_parameters() const;
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

// The tensors of m.trainable_parameters().
std::vector<Tensor> trainable_tensors(const Module& m);

// Whether parameter name `name` matches glob `pattern`: '*' any run of
// characters (dots included), '?' any one character, '[A-B]' a decimal
// number from A to B inclusive (a layer range: "model.layers.[0-11].*"),
// anything else itself.
bool name_matches(const std::string& pattern, const std::string& name);

// Freezes (requires_grad false) every parameter of `m` matching one of
// `patterns`; returns the names frozen. Throws Error naming a pattern that
// matches nothing or is malformed (an unclosed or reversed range), before
// freezing anything.
std::vector<std::string> freeze_parameters(const Module& m, const std::vector<std::string>& patterns);

}  // namespace remat
