#include "engine/op_def.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>

#include "engine/error.h"
#include "engine/immortal.h"

namespace remat {

namespace {

// Each op with a copy of its name: registration and lookup never read another
// op's object, which may be a global of another translation unit (reading one
// from a static initializer is an init-order report under ASan).
struct Entry {
  std::string name;
  const OpDef* def;
};

struct Table {
  std::mutex mu;
  std::vector<Entry> ops;
};

Table& table() {
  static detail::Immortal<Table> t;
  return t.get();
}

// Throws Error unless spec's saves and output dtypes name existing inputs,
// outputs and intermediates consistently.
void validate(const OpSpec& s) {
  REMAT_CHECK(s.name && *s.name, Error, "OpDef: an op needs a name");
  const int n_in = int(s.inputs.size()), n_out = int(s.outputs.size());
  REMAT_CHECK(n_in <= 32, Error, "op '", s.name, "': at most 32 inputs, got ", n_in);
  REMAT_CHECK(!s.variadic || n_in >= 1, Error, "op '", s.name, "': a variadic op names its list input");
  REMAT_CHECK(!s.variadic_outputs || n_out == 1, Error, "op '", s.name,
              "': variadic outputs are named by exactly one output spec");
  for (const OutputSpec& o : s.outputs) {
    REMAT_CHECK(o.dtype.kind != OutDType::Kind::like_input || (o.dtype.input >= 0 && o.dtype.input < n_in), Error,
                "op '", s.name, "': output '", o.name, "' takes the dtype of input ", o.dtype.input, " of ", n_in);
  }
  for (std::size_t i = 0; i < s.saves.size(); ++i) {
    const SaveSpec& v = s.saves[i];
    for (std::size_t j = 0; j < i; ++j)
      REMAT_CHECK(std::strcmp(s.saves[j].name, v.name) != 0, Error, "op '", s.name, "': save '", v.name,
                  "' is named twice");
    REMAT_CHECK(v.from != SaveFrom::input || (v.index >= 0 && v.index < n_in), Error, "op '", s.name, "': save '",
                v.name, "' names input ", v.index, " of ", n_in);
    REMAT_CHECK(v.from != SaveFrom::output || (v.index >= 0 && v.index < n_out), Error, "op '", s.name,
                "': save '", v.name, "' names output ", v.index, " of ", n_out);
    REMAT_CHECK(v.index >= 0, Error, "op '", s.name, "': save '", v.name, "' has a negative index");
    // Cached outputs replace the forward, which then yields no intermediates.
    REMAT_CHECK(!s.replay_cacheable || v.from != SaveFrom::intermediate, Error, "op '", s.name,
                "': a replay-cacheable op cannot save intermediates (save '", v.name, "')");
  }
  REMAT_CHECK(s.autograd == OpAutograd::node || s.saves.empty(), Error, "op '", s.name,
              "': only an op that records its own node saves tensors");
}

}  // namespace

OpDef::OpDef(OpSpec spec) : spec_(std::move(spec)) {
  validate(spec_);
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  for (const Entry& e : t.ops)
    REMAT_CHECK(e.name != spec_.name, Error, "op '", spec_.name,
                "' is defined twice (op names are unique in the op table)");
  t.ops.push_back({spec_.name, this});
}

OpDef::~OpDef() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  std::erase_if(t.ops, [this](const Entry& e) { return e.def == this; });
}

int OpDef::save_index(std::string_view name) const {
  for (std::size_t i = 0; i < spec_.saves.size(); ++i)
    if (name == spec_.saves[i].name) return int(i);
  return -1;
}

OpCost OpDef::cost(const OpCall&) const { return {}; }

std::vector<const OpDef*> op_table() {
  Table& t = table();
  std::vector<Entry> entries;
  {
    std::lock_guard<std::mutex> lock(t.mu);
    entries = t.ops;
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.name < b.name; });
  std::vector<const OpDef*> ops;
  ops.reserve(entries.size());
  for (const Entry& e : entries) ops.push_back(e.def);
  return ops;
}

const OpDef* find_op(std::string_view name) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  for (const Entry& e : t.ops)
    if (name == e.name) return e.def;
  return nullptr;
}

}  // namespace remat
