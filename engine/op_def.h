// The op table: what every op declares once. An op's record (OpDef) names
// the op, its tensor inputs and outputs, the tensors it saves for backward
// (each by name, from an input, an output or an intermediate of its forward,
// and for which input gradients), whether a selective checkpoint may hand
// back its cached outputs instead of running its kernel, and what one call
// costs. ops/op.h runs ops from these records (Op<State>); every record
// registers itself in the table when it is constructed, so tools, tests and
// checkpoint policies enumerate ops instead of keeping lists.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "engine/device.h"
#include "engine/dtype.h"

namespace remat {

struct OpCall;

// A set of an op's inputs: bit i is input i.
using InputMask = std::uint32_t;
// Every input (a save marked so is made whenever the op records a node).
inline constexpr InputMask kAnyInput = ~InputMask(0);
// The mask of the listed input positions (each in [0, 32)).
constexpr InputMask inputs_mask(std::initializer_list<int> inputs) {
  InputMask m = 0;
  for (int i : inputs) m |= InputMask(1) << i;
  return m;
}

// Where a saved tensor comes from.
enum class SaveFrom : std::uint8_t {
  input,         // an input of the call
  output,        // an output (saved with is_output)
  intermediate,  // a tensor the forward computed besides its outputs (statistics, index lists)
};

// One tensor an op saves for backward. Saves are made in the order listed.
struct SaveSpec {
  const char* name;  // how the backward asks for it
  SaveFrom from;
  int index;         // which input, output or intermediate
  // Made only when one of these inputs needs a gradient; otherwise an empty
  // save keeps its place. kAnyInput: whenever the op records a node.
  InputMask for_grads = kAnyInput;
};

// The dtype an op output has: the op's runner converts what the forward
// returned to it (a CPU kernel computes a 16-bit op in f32; the dtype rule is
// written once, in ops/op.h and ops/kernel_table.h).
struct OutDType {
  enum class Kind : std::uint8_t { like_input, fixed, as_computed } kind = Kind::like_input;
  int input = 0;             // like_input: that input's dtype
  DType dtype = DType::f32;  // fixed: this dtype
};
// The dtype of input i.
constexpr OutDType like_input(int i) { return {OutDType::Kind::like_input, i, DType::f32}; }
// Always `t` (statistics kept in f32, index outputs).
constexpr OutDType always(DType t) { return {OutDType::Kind::fixed, 0, t}; }
// Whatever the forward returned (ops that run other ops, raw copies of any dtype).
constexpr OutDType as_computed() { return {OutDType::Kind::as_computed, 0, DType::f32}; }

struct OutputSpec {
  const char* name;
  OutDType dtype = like_input(0);
  bool differentiable = true;  // false: no gradient flows through it (indices, statistics)
};

// How an op is differentiated.
enum class OpAutograd : std::uint8_t {
  node,   // it records its own node, with its backward and saves
  inner,  // the ops and views its forward runs record it (cast, split)
  none,   // not differentiable (in-place updates; an input requiring grad is refused by its checks)
};

// Everything an op declares, in one record.
struct OpSpec {
  const char* name;  // unique; names the op in errors, hooks, saves, reports and policies
  // Input names in call order. With `variadic`, the last name stands for any
  // number of tensors (cat's list).
  std::vector<const char*> inputs = {};
  bool variadic = false;
  std::vector<OutputSpec> outputs = {};
  // The one output spec stands for any number of outputs (split's views).
  bool variadic_outputs = false;
  std::vector<SaveSpec> saves = {};
  OpAutograd autograd = OpAutograd::node;
  // Input saves are made before the kernel runs (a checkpoint replay whose
  // last needed saves they are stops before computing the op's product).
  bool saves_inputs_first = false;
  // A selective checkpoint policy may keep its outputs, and its replay then
  // skips the kernel (checkpoint/policy.h lists these ops from the table).
  bool replay_cacheable = false;
  // Its forward runs a collective (its results depend on other ranks):
  // dynamic rematerialization never computes it again, so its outputs stay
  // resident (checkpoint/dynamic_remat.h).
  bool collective = false;
  const char* summary = "";  // one line for the op table's listing
};

// What one call costs, for FLOP counts (bench's recompute FLOPs) and cost
// models. Products count 2 FLOPs per multiply-add.
struct OpCost {
  double matmul_flops = 0;  // in matrix products (GEMMs, attention's two products)
  double vector_flops = 0;  // everything else (elementwise, reductions, exp)
  double bytes = 0;         // bytes read and written once (inputs and outputs)
};

// An op's record. Constructing one registers it in the op table (a second
// record of the same name throws Error); destroying it removes it. Records
// of built-in ops live for the program.
class OpDef {
 public:
  // Throws Error naming the op if the spec is inconsistent (a save or output
  // dtype naming an input or output that does not exist, a duplicate save
  // name, a cacheable op that saves intermediates, ...).
  explicit OpDef(OpSpec spec);
  virtual ~OpDef();
  OpDef(const OpDef&) = delete;
  OpDef& operator=(const OpDef&) = delete;

  const OpSpec& spec() const { return spec_; }
  const char* name() const { return spec_.name; }
  // The position of save `name` in spec().saves, or -1.
  int save_index(std::string_view name) const;

  // The cost of `call` (a call of this op); zeros unless the op defines one.
  virtual OpCost cost(const OpCall& call) const;
  // The devices this op has kernels for; empty when the op runs other ops
  // (it works wherever they do).
  virtual std::vector<DeviceType> kernel_devices() const { return {}; }
  // Whether the op defines a cost.
  virtual bool has_cost() const { return false; }

 private:
  OpSpec spec_;
};

// Every registered op, sorted by name.
std::vector<const OpDef*> op_table();
// The op named `name`, or nullptr.
const OpDef* find_op(std::string_view name);

}  // namespace remat
