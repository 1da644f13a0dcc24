// Custom ops: the context, name interning, and the call that records the op.
#include "engine/custom_op.h"

#include <algorithm>
#include <mutex>
#include <set>

#include "engine/grad_mode.h"
#include "engine/op_hooks.h"
#include "engine/producer_observer.h"

namespace remat {

namespace {

// Op names live as long as the program: nodes, saves and op hooks keep
// their c_str(). Guarded because ops may be built on any thread.
const std::string* intern_name(const std::string& name) {
  static std::mutex mu;
  static std::set<std::string> names;
  std::lock_guard<std::mutex> lock(mu);
  return &*names.insert(name).first;
}

const void* identity(const Tensor& t) { return &t.impl(); }

// Shape, dtype and device of each tensor (an empty meta where undefined).
std::vector<TensorMeta> metas_of(const std::vector<Tensor>& ts) {
  std::vector<TensorMeta> m;
  for (const auto& t : ts) m.push_back(t.defined() ? TensorMeta{t.sizes(), t.dtype(), t.device()} : TensorMeta{});
  return m;
}

// An output that is an input, or that has history of its own (a captured
// parameter), gets a fresh alias so its original keeps its history; marked or
// integer outputs get no history and are never an input's handle. Returns
// the outputs that take the node's history.
std::vector<Tensor*> detach_outputs(std::vector<Tensor>& outs, const std::vector<std::size_t>& diff,
                    const std::vector<const void*>& out_ids, const std::vector<Tensor>& inputs) {
  std::vector<Tensor*> with_history;
  for (std::size_t i : diff) {
    Tensor& o = outs[i];
    const bool is_input = std::any_of(inputs.begin(), inputs.end(),
                                      [&](const Tensor& in) { return in.defined() && identity(in) == out_ids[i]; });
    if (is_input || o.impl().autograd) o = o.detach();
    with_history.push_back(&o);
  }
  for (auto& o : outs)
    if (o.defined() && std::find(with_history.begin(), with_history.end(), &o) == with_history.end() &&
        o.impl().autograd)
      o = o.detach();
  return with_history;
}

}  // namespace

// ---------------------------------------------------------------------------
// CustomOpContext

void CustomOpContext::save_for_backward(const std::vector<Tensor>& tensors) {
  REMAT_CHECK(in_forward_, AutogradError, "custom op '", op(), "': save_for_backward is for its forward function");
  if (!recording_) return;
  pending_saves_.insert(pending_saves_.end(), tensors.begin(), tensors.end());
}

std::vector<Tensor> CustomOpContext::saved_tensors() const {
  REMAT_CHECK(node_ != nullptr, AutogradError, "custom op '", op(),
              "': saved_tensors is for its backward function (the forward's saves are unpacked there)");
  std::vector<Tensor> out;
  out.reserve(n_saved_);
  for (std::size_t i = 0; i < n_saved_; ++i) out.push_back(node_->saved(i));
  return out;
}

void CustomOpContext::mark_non_differentiable(const std::vector<Tensor>& outputs) {
  REMAT_CHECK(in_forward_, AutogradError, "custom op '", op(),
              "': mark_non_differentiable is for its forward function");
  for (const auto& t : outputs)
    if (t.defined()) non_differentiable_.push_back(identity(t));
}

void CustomOpContext::set(const std::string& key, std::any v) {
  for (auto& [k, old] : values_)
    if (k == key) {
      old = std::move(v);
      return;
    }
  values_.emplace_back(key, std::move(v));
}

const std::any& CustomOpContext::value(const std::string& key) const {
  for (const auto& [k, v] : values_)
    if (k == key) return v;
  std::string known;
  for (const auto& [k, v] : values_) known += (known.empty() ? "'" : ", '") + k + "'";
  throw AutogradError("custom op '" + op() + "': no context value '" + key + "' was set in forward (set: " +
                      (known.empty() ? std::string("none") : known) + ")");
}

// ---------------------------------------------------------------------------
// CustomOp

CustomOp::CustomOp(const std::string& name, ForwardFn forward, BackwardFn backward) : name_(intern_name(name)) {
  REMAT_CHECK(!name.empty(), Error, "CustomOp: the op needs a name (it names the op in hooks, reports and errors)");
  REMAT_CHECK(forward != nullptr && backward != nullptr, Error, "CustomOp '", name, "': ",
              forward ? "backward" : "forward", " function is missing");
  forward_ = std::make_shared<const ForwardFn>(std::move(forward));
  backward_ = std::make_shared<const BackwardFn>(std::move(backward));
}

Tensor CustomOp::apply1(const std::vector<Tensor>& inputs) const {
  std::vector<Tensor> out = (*this)(inputs);
  REMAT_CHECK(out.size() == 1, Error, "custom op '", name(), "': apply1 needs exactly one output, forward returned ",
              out.size());
  return out[0];
}

std::vector<Tensor> CustomOp::run_forward(CustomOpContext& ctx, const std::vector<Tensor>& inputs) const {
  std::vector<Tensor> outs;
  ProducerCapture capture;  // dynamic rematerialization's record: the forward (engine/producer_observer.h)
  {
    NoGradGuard no_grad;
    ctx.in_forward_ = true;
    struct Leave {
      CustomOpContext& c;
      ~Leave() { c.in_forward_ = false; }
    } leave{ctx};
    outs = (*forward_)(ctx, inputs);
  }
  if (capture.active())
    capture.report(name_->c_str(), inputs, outs, false,
                   [fwd = forward_, name = name_, needs = ctx.needs_grad_](const std::vector<Tensor>& in) {
                     CustomOpContext again;  // saves nothing: it records no node
                     again.name_ = name;
                     again.needs_grad_ = needs;
                     again.in_forward_ = true;
                     return (*fwd)(again, in);
                   });
  return outs;
}

std::vector<Tensor> CustomOp::operator()(const std::vector<Tensor>& inputs) const {
  const char* op = name_->c_str();
  return run_op_call(OpCall{op, inputs}, [&]() -> std::vector<Tensor> {
    std::vector<const Tensor*> ptrs;
    ptrs.reserve(inputs.size());
    for (const auto& t : inputs) ptrs.push_back(&t);
    std::shared_ptr<Node> node = autograd::make_node(op, ptrs);

    auto ctx = std::make_shared<CustomOpContext>();
    ctx->name_ = name_;
    ctx->recording_ = node != nullptr;
    for (std::size_t i = 0; i < inputs.size(); ++i) ctx->needs_grad_.push_back(node && node->needs_input_grad(i));

    std::vector<Tensor> outs = run_forward(*ctx, inputs);
    if (!node) return outs;

    // Which outputs carry history: floating ones not marked otherwise.
    std::vector<const void*> out_ids;
    for (const auto& o : outs) out_ids.push_back(o.defined() ? identity(o) : nullptr);
    for (const void* id : ctx->non_differentiable_)
      REMAT_CHECK(std::find(out_ids.begin(), out_ids.end(), id) != out_ids.end(), AutogradError, "custom op '", op,
                  "': mark_non_differentiable was given a tensor that its forward does not return");
    std::vector<std::size_t> diff;  // output indices with history
    std::vector<TensorMeta> metas;  // every output's, for zero gradients
    std::vector<bool> defined;
    for (std::size_t i = 0; i < outs.size(); ++i) {
      const Tensor& o = outs[i];
      metas.push_back(o.defined() ? TensorMeta{o.sizes(), o.dtype(), o.device()} : TensorMeta{});
      defined.push_back(o.defined());
      const bool marked = std::find(ctx->non_differentiable_.begin(), ctx->non_differentiable_.end(), out_ids[i]) !=
                          ctx->non_differentiable_.end();
      if (o.defined() && is_floating(o.dtype()) && !marked) diff.push_back(i);
    }

    // The saves, now that the outputs are known.
    for (const auto& t : ctx->pending_saves_) {
      const bool is_output = t.defined() && std::find(out_ids.begin(), out_ids.end(), identity(t)) != out_ids.end();
      node->save(t, is_output);
    }
    ctx->n_saved_ = ctx->pending_saves_.size();
    ctx->pending_saves_.clear();
    ctx->non_differentiable_.clear();

    const std::vector<Tensor*> with_history = detach_outputs(outs, diff, out_ids, inputs);

    node->backward_fn = [ctx, backward = backward_, diff, metas, defined, in_metas = metas_of(inputs)](Node& self, std::vector<Tensor>& grads) {
      const std::string& name = ctx->op();
      std::vector<Tensor> full(metas.size());
      for (std::size_t k = 0; k < diff.size(); ++k) full[diff[k]] = grads[k];
      for (std::size_t i = 0; i < full.size(); ++i)
        if (!full[i].defined() && defined[i])
          full[i] = zeros(metas[i].sizes, TensorOptions(metas[i].dtype, metas[i].device));
      ctx->node_ = &self;
      struct Leave {
        CustomOpContext& c;
        ~Leave() { c.node_ = nullptr; }
      } leave{*ctx};
      std::vector<Tensor> res = (*backward)(*ctx, full);
      REMAT_CHECK(res.size() == in_metas.size(), AutogradError, "custom op '", name, "': backward returned ",
                  res.size(), " gradients for ", in_metas.size(), " inputs (one per input; undefined for none)");
      for (std::size_t i = 0; i < res.size(); ++i) {
        if (!ctx->needs_input_grad(i)) {
          res[i] = Tensor();
          continue;
        }
        if (!res[i].defined()) continue;
        const TensorMeta& m = in_metas[i];
        REMAT_CHECK(res[i].sizes() == m.sizes && res[i].dtype() == m.dtype && res[i].device() == m.device,
                    AutogradError, "custom op '", name, "': backward returned a gradient of shape ",
                    shape_str(res[i].sizes()), " ", res[i].dtype(), " on ", res[i].device(), " for input ", i,
                    ", which is ", shape_str(m.sizes), " ", m.dtype, " on ", m.device,
                    "; a gradient must match its input");
      }
      return res;
    };
    autograd::set_history(with_history, node);
    return outs;
  });
}

}  // namespace remat
