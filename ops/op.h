// Defining an op once. An op is its record (OpSpec, engine/op_def.h) plus
// the functions beside it: argument checks, the forward (which calls the
// op's kernels for the inputs' device through its KernelTable), the backward
// formula reading its saves by name, and its cost. Op<State> runs a call of
// them the same way for every op: checks, the op hooks, the node and its
// saves (when and what the record says), a selective replay's cached
// outputs, the dtype rule, and the outputs' history. A new op is one such
// definition in one file, and one test file (tests/ops/square_op_test.cc
// shows the whole of it).
//
//   OpResults forward(const std::vector<Tensor>& in, NoState&) {
//     return {{swiglu_kernels().run(in[0].device(), &SwigluKernels::forward, in[0], in[1])}};
//   }
//   std::vector<Tensor> backward(const OpBackward<NoState>& b) {
//     auto [dg, du] = ...(b.grad(), b.saved("gate"), b.saved("up"), b.needs(0), b.needs(1));
//     return {dg, du};
//   }
//   const Op<> kSwiglu({.name = "swiglu", .inputs = {"gate", "up"}, .outputs = {{"out"}},
//                       .saves = {{"gate", SaveFrom::input, 0},
//                                 {"up", SaveFrom::input, 1, inputs_mask({0})}}},
//                      {.check = check, .forward = forward, .backward = backward, .cost = cost},
//                      &swiglu_kernels());
//   Tensor swiglu(const Tensor& gate, const Tensor& up) { return kSwiglu.call1({gate, up}); }
//
// The dtype rule (with ops/kernel_table.h): a kernel returns what its device
// computes in (CPU: f32); the runner converts each output to its OutDType and
// each input gradient the backward returns to that input's dtype.
//
// Exception neutrality: an exception unwinding through a call (a checkpoint
// replay's StopReplay among them) leaves the graph as it was. The runner
// gives the outputs their history only after the forward returned, so a
// node made before a throwing forward dies with its saves; op bodies must
// keep their effects local (no state outside their results changed before
// they can fail) so that this holds.
//
// An Op must outlive the graphs recorded with it (built-in ops are static).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/autograd.h"
#include "engine/grad_mode.h"
#include "engine/op_def.h"
#include "engine/op_hooks.h"
#include "engine/producer_observer.h"
#include "engine/tensor.h"
#include "ops/kernel_table.h"

namespace remat {

// The state of an op without attributes.
struct NoState {};

// What an op's forward returns: its outputs in OpSpec order, and the
// intermediates its saves name (SaveFrom::intermediate), in index order.
struct OpResults {
  OpResults() = default;
  OpResults(std::vector<Tensor> outs, std::vector<Tensor> inter = {})  // NOLINT: {{out}} reads best
      : outputs(std::move(outs)), intermediates(std::move(inter)) {}
  std::vector<Tensor> outputs;
  std::vector<Tensor> intermediates;
};

// What the backward of one call sees.
template <class State>
class OpBackward {
 public:
  OpBackward(const OpDef& def, Node& node, std::vector<Tensor>& grads, const std::vector<TensorMeta>& inputs,
             const State& state)
      : def_(def), node_(node), grads_(grads), inputs_(inputs), state_(state),
        unpacked_(def.spec().saves.size()) {}

  // The gradient of output i (zeros of its shape when none flowed).
  const Tensor& grad(std::size_t i = 0) const { return grads_.at(i); }
  // Whether the backward may write into output i's gradient (a result in
  // its buffer, say): nothing else can read it (detail::writable_alone).
  bool grad_writable(std::size_t i = 0) const { return detail::writable_alone(grads_.at(i)); }
  // Whether input i needs a gradient.
  bool needs(std::size_t i) const { return node_.needs_input_grad(i); }
  // Shape, dtype and device input i had at the call.
  const TensorMeta& input(std::size_t i) const { return inputs_.at(i); }
  std::size_t num_inputs() const { return inputs_.size(); }
  // The op's state: its attributes and what its forward recorded.
  const State& state() const { return state_; }
  // The tensor saved as `name`, unpacked through the saved-tensor hooks. It
  // is unpacked once per backward (a checkpoint region's unpack hands over
  // the regenerated tensor, and a second one would replay the region again);
  // later calls return the same tensor. Throws AutogradError for a name the
  // op does not save.
  const Tensor& saved(std::string_view name) const {
    const int i = def_.save_index(name);
    REMAT_CHECK(i >= 0, AutogradError, "op '", def_.name(), "' saves no tensor named '", std::string(name), "'");
    auto& slot = unpacked_[std::size_t(i)];
    if (!slot) slot = node_.saved(std::size_t(i));
    return *slot;
  }

 private:
  const OpDef& def_;
  Node& node_;
  std::vector<Tensor>& grads_;
  const std::vector<TensorMeta>& inputs_;
  const State& state_;
  mutable std::vector<std::optional<Tensor>> unpacked_;
};

// The functions that define an op beside its OpSpec. Only forward is required.
template <class State>
struct OpFns {
  // Throws a typed Error naming the op (op.name()), the shapes and dtypes,
  // and what was expected, before anything runs.
  void (*check)(const OpDef& op, const std::vector<Tensor>& in, const State& state) = nullptr;
  // The outputs (and intermediates), with grad recording off (ops that
  // OpAutograd::inner record through what they run: their forward runs with
  // the caller's grad mode). May record facts for backward in `state`.
  OpResults (*forward)(const std::vector<Tensor>& in, State& state) = nullptr;
  // One gradient per input, undefined where b.needs(i) is false or the input
  // is not differentiable. Runs with grad recording off.
  std::vector<Tensor> (*backward)(const OpBackward<State>& b) = nullptr;
  // What a call costs.
  OpCost (*cost)(const std::vector<Tensor>& in, const State& state) = nullptr;
  // Results that other results give again more cheaply than the forward, bit
  // for bit (engine/producer_observer.h's DerivedResult), for dynamic
  // rematerialization; called with the state the call started with.
  std::vector<DerivedResult> (*derive)(const State& state) = nullptr;
};

namespace detail {
// The parts of running a call that do not depend on State (ops/op.cc).

// The node for a call of `def` over `in` when grad mode is on and an input
// requires grad; nullptr otherwise.
std::shared_ptr<Node> make_op_node(const OpDef& def, const std::vector<Tensor>& in);
// Makes the saves of def.spec().saves taken from inputs (first == true) or
// from outputs and intermediates (first == false), in order.
void make_saves(const OpDef& def, Node& node, const std::vector<Tensor>& in, const OpResults* results,
                bool inputs_only);
// Converts each output to the dtype its OutputSpec declares.
void convert_outputs(const OpDef& def, const std::vector<Tensor>& in, std::vector<Tensor>& outputs);
// Gives the differentiable outputs `node` as their history.
void set_output_history(const OpDef& def, std::vector<Tensor>& outputs, const std::shared_ptr<Node>& node);
// The input metas a node keeps for backward.
std::vector<TensorMeta> input_metas(const std::vector<Tensor>& in);
// Converts each defined gradient to its input's dtype; checks the count.
void convert_grads(const OpDef& def, const std::vector<TensorMeta>& inputs, std::vector<Tensor>& grads);
// Throws AutogradError: the op's forward returned the wrong number of results.
void check_results(const OpDef& def, const OpResults& r);
}  // namespace detail

template <class State = NoState>
class Op final : public OpDef {
 public:
  // Registers the op in the op table. `kernels`: the table its forward and
  // backward take kernels from (nullptr for ops that run other ops).
  Op(OpSpec spec, OpFns<State> fns, const KernelTableBase* kernels = nullptr)
      : OpDef(std::move(spec)), fns_(fns), kernels_(kernels) {
    REMAT_CHECK(fns_.forward != nullptr, Error, "op '", name(), "' has no forward");
    REMAT_CHECK(this->spec().autograd != OpAutograd::node || fns_.backward != nullptr, Error, "op '", name(),
                "' records a node but has no backward");
  }

  // Runs the op on `in` with attributes `state`; returns its outputs.
  std::vector<Tensor> operator()(std::vector<Tensor> in, State state = {}) const {
    if (fns_.check) fns_.check(*this, in, state);
    const OpCall call{name(), in, this, &state};
    return run_op_call(call, [&] { return body(in, state); });
  }
  // The same for an op with one output.
  Tensor call1(std::vector<Tensor> in, State state = {}) const { return (*this)(std::move(in), std::move(state))[0]; }

  OpCost cost(const OpCall& call) const override {
    return fns_.cost ? fns_.cost(call.inputs, *static_cast<const State*>(call.attrs)) : OpCost{};
  }
  bool has_cost() const override { return fns_.cost != nullptr; }
  std::vector<DeviceType> kernel_devices() const override {
    return kernels_ ? kernels_->devices() : std::vector<DeviceType>{};
  }

 private:
  std::vector<Tensor> body(const std::vector<Tensor>& in, State& state) const {
    const OpSpec& s = spec();
    std::shared_ptr<Node> node = s.autograd == OpAutograd::node ? detail::make_op_node(*this, in) : nullptr;
    if (node && s.saves_inputs_first) detail::make_saves(*this, *node, in, nullptr, true);
    OpResults r;
    std::optional<std::vector<Tensor>> cached;
    if (s.replay_cacheable) cached = take_cached_outputs();
    // Dynamic rematerialization's record of the call (engine/producer_observer.h).
    std::optional<ProducerCapture> capture;
    std::optional<State> first;
    if (cached) {
      for (Tensor& t : *cached) r.outputs.push_back(t.defined() ? t.detach() : t);
    } else if (s.autograd == OpAutograd::inner) {
      r = fns_.forward(in, state);
    } else {
      capture.emplace();
      if (capture->active() && !s.collective) first = state;
      NoGradGuard ng;
      r = fns_.forward(in, state);
    }
    detail::check_results(*this, r);
    detail::convert_outputs(*this, in, r.outputs);
    if (capture && capture->active()) report(*capture, in, r, std::move(first));
    if (node) {
      detail::make_saves(*this, *node, in, &r, false);
      node->backward_fn = [this, metas = detail::input_metas(in), st = state](
                              Node& n, std::vector<Tensor>& grads) {
        const OpBackward<State> b(*this, n, grads, metas, st);
        std::vector<Tensor> g = fns_.backward(b);
        detail::convert_grads(*this, metas, g);
        return g;
      };
      detail::set_output_history(*this, r.outputs, node);
    }
    return std::move(r.outputs);
  }

  // Hands the call to dynamic rematerialization: its results, and a
  // function computing them again from the state the call started with.
  void report(ProducerCapture& capture, const std::vector<Tensor>& in, const OpResults& r,
              std::optional<State> first) const {
    std::vector<Tensor> results = r.outputs;
    results.insert(results.end(), r.intermediates.begin(), r.intermediates.end());
    RecomputeFn again;
    std::vector<DerivedResult> derived;
    if (first && fns_.derive) derived = fns_.derive(*first);
    if (first)
      again = [this, st = std::move(*first)](const std::vector<Tensor>& inputs) {
        State s2 = st;
        OpResults r2 = fns_.forward(inputs, s2);
        detail::check_results(*this, r2);
        detail::convert_outputs(*this, inputs, r2.outputs);
        std::vector<Tensor> out = std::move(r2.outputs);
        out.insert(out.end(), r2.intermediates.begin(), r2.intermediates.end());
        return out;
      };
    capture.report(name(), in, results, spec().collective, std::move(again), std::move(derived));
  }

  OpFns<State> fns_;
  const KernelTableBase* kernels_;
};

}  // namespace remat
