#include "ops/op.h"

#include <algorithm>

namespace remat::detail {

std::shared_ptr<Node> make_op_node(const OpDef& def, const std::vector<Tensor>& in) {
  std::vector<const Tensor*> ptrs;
  ptrs.reserve(in.size());
  for (const Tensor& t : in) ptrs.push_back(&t);
  return autograd::make_node(def.name(), ptrs);
}

namespace {

// Whether `node` needs save `s`: one of its inputs needs a gradient.
bool wanted(const SaveSpec& s, const Node& node) {
  if (s.for_grads == kAnyInput) return true;
  for (std::size_t i = 0; i < node.next_edges.size() && i < 32; ++i)
    if ((s.for_grads >> i) & 1u && node.needs_input_grad(i)) return true;
  return false;
}

const Tensor& pick(const OpDef& def, const SaveSpec& s, const std::vector<Tensor>& in, const OpResults& r) {
  const std::vector<Tensor>& from = s.from == SaveFrom::input ? in : s.from == SaveFrom::output ? r.outputs
                                                                                                : r.intermediates;
  REMAT_CHECK(std::size_t(s.index) < from.size(), AutogradError, "op '", def.name(), "': save '", s.name, "' takes ",
              s.from == SaveFrom::input ? "input" : s.from == SaveFrom::output ? "output" : "intermediate", " ",
              s.index, " but the call has ", from.size());
  return from[std::size_t(s.index)];
}

}  // namespace

void make_saves(const OpDef& def, Node& node, const std::vector<Tensor>& in, const OpResults* results,
                bool inputs_only) {
  const OpSpec& spec = def.spec();
  static const OpResults kNone;
  for (const SaveSpec& s : spec.saves) {
    const bool is_input = s.from == SaveFrom::input;
    // With saves_inputs_first, inputs are saved by the first call, the rest by the second.
    if (spec.saves_inputs_first && is_input != inputs_only) continue;
    if (!spec.saves_inputs_first && inputs_only) continue;
    if (!wanted(s, node)) {
      node.save(Tensor());
      continue;
    }
    node.save(pick(def, s, in, results ? *results : kNone), s.from == SaveFrom::output);
  }
}

void convert_outputs(const OpDef& def, const std::vector<Tensor>& in, std::vector<Tensor>& outputs) {
  const auto& specs = def.spec().outputs;
  for (std::size_t i = 0; i < outputs.size() && !specs.empty(); ++i) {
    Tensor& t = outputs[i];
    const OutDType& d = specs[std::min(i, specs.size() - 1)].dtype;
    if (!t.defined() || d.kind == OutDType::Kind::as_computed) continue;
    const DType want = d.kind == OutDType::Kind::fixed ? d.dtype : in[std::size_t(d.input)].dtype();
    if (t.dtype() != want) t = t.to(want);
  }
}

void set_output_history(const OpDef& def, std::vector<Tensor>& outputs, const std::shared_ptr<Node>& node) {
  const auto& specs = def.spec().outputs;
  std::vector<Tensor*> diff;
  for (std::size_t i = 0; i < outputs.size(); ++i)
    if (i >= specs.size() || specs[i].differentiable) diff.push_back(&outputs[i]);
  autograd::set_history(diff, node);
}

std::vector<TensorMeta> input_metas(const std::vector<Tensor>& in) {
  std::vector<TensorMeta> m;
  m.reserve(in.size());
  for (const Tensor& t : in)
    m.push_back(t.defined() ? TensorMeta{t.sizes(), t.dtype(), t.device()} : TensorMeta{});
  return m;
}

void convert_grads(const OpDef& def, const std::vector<TensorMeta>& inputs, std::vector<Tensor>& grads) {
  REMAT_CHECK(grads.size() == inputs.size(), AutogradError, "backward of op '", def.name(), "' returned ",
              grads.size(), " gradients for ", inputs.size(), " inputs");
  for (std::size_t i = 0; i < grads.size(); ++i)
    if (grads[i].defined() && grads[i].dtype() != inputs[i].dtype) grads[i] = grads[i].to(inputs[i].dtype);
}

void check_results(const OpDef& def, const OpResults& r) {
  const auto& spec = def.spec();
  if (spec.variadic_outputs) return;
  REMAT_CHECK(r.outputs.size() == spec.outputs.size(), AutogradError, "op '", def.name(), "': its forward returned ",
              r.outputs.size(), " outputs, its record declares ", spec.outputs.size());
}

}  // namespace remat::detail
