// ./remat ops: the op table (engine/op_def.h) as a table or markdown.
#include <cstdio>
#include <string>

#include "engine/op_def.h"
#include "tools/args.h"
#include "tools/commands.h"

namespace remat::tools {

namespace {

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string s;
  for (const auto& p : parts) s += (s.empty() ? "" : sep) + p;
  return s;
}

// "x, weight if dx" : each save, with the inputs whose gradients need it.
std::string saves_of(const OpSpec& s) {
  std::vector<std::string> out;
  for (const SaveSpec& v : s.saves) {
    std::string e = v.name;
    if (v.from == SaveFrom::output) e += " (output)";
    if (v.from == SaveFrom::intermediate) e += " (computed)";
    if (v.for_grads != kAnyInput) {
      std::vector<std::string> who;
      for (std::size_t i = 0; i < s.inputs.size(); ++i)
        if ((v.for_grads >> i) & 1u) who.push_back(std::string("d") + s.inputs[i]);
      e += " for " + join(who, "/");
    }
    out.push_back(e);
  }
  return out.empty() ? "-" : join(out, ", ");
}

std::string names_of(const std::vector<const char*>& names, bool variadic) {
  std::vector<std::string> v(names.begin(), names.end());
  if (variadic && !v.empty()) v.back() += "...";
  return join(v, ", ");
}

std::string outputs_of(const OpSpec& s) {
  std::vector<std::string> v;
  for (const OutputSpec& o : s.outputs) v.push_back(std::string(o.name) + (o.differentiable ? "" : " (no grad)"));
  std::string r = join(v, ", ");
  return s.variadic_outputs ? r + "..." : r;
}

std::string kernels_of(const OpDef& op) {
  std::vector<std::string> v;
  for (DeviceType t : op.kernel_devices()) v.push_back(device_type_name(t));
  return v.empty() ? "(runs other ops)" : join(v, ", ");
}

std::string flags_of(const OpSpec& s) {
  std::vector<std::string> v;
  if (s.autograd == OpAutograd::none) v.push_back("not differentiable");
  if (s.autograd == OpAutograd::inner) v.push_back("autograd by what it runs");
  if (s.saves_inputs_first) v.push_back("inputs saved first");
  if (s.replay_cacheable) v.push_back("replay-cacheable");
  return join(v, ", ");
}

}  // namespace

int run_ops(const std::vector<std::string>& args) {
  Flags f("ops", "the op table: every op, its inputs, saves, kernels and flags", args,
          {bool_flag("markdown", "print the table as markdown rows (docs/REFERENCE.md's op table)")});
  const bool md = f.get_bool("markdown");
  if (md) {
    std::printf("| op | inputs | outputs | saves for backward | kernels | notes |\n|---|---|---|---|---|---|\n");
  } else {
    std::printf("%-30s %-26s %-22s %s\n", "op", "inputs", "kernels", "what");
  }
  for (const OpDef* op : op_table()) {
    const OpSpec& s = op->spec();
    const std::string in = names_of(s.inputs, s.variadic);
    if (md) {
      const std::string notes = flags_of(s);
      std::printf("| `%s` | %s | %s | %s | %s | %s%s%s |\n", s.name, in.c_str(), outputs_of(s).c_str(),
                  saves_of(s).c_str(), kernels_of(*op).c_str(), s.summary, notes.empty() ? "" : "; ", notes.c_str());
    } else {
      std::printf("%-30s %-26s %-22s %s\n", s.name, in.c_str(), kernels_of(*op).c_str(), s.summary);
    }
  }
  return 0;
}

}  // namespace remat::tools
