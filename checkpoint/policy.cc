#include "checkpoint/policy.h"

#include <algorithm>

#include "engine/error.h"
#include "engine/op_def.h"

namespace remat {

const std::vector<std::string>& replay_cacheable_ops() {
  // From the op table, once: every record is registered at static
  // initialisation, before any policy asks. tests/checkpoint/policy_test.cc
  // checks that each listed op really skips its kernel.
  static const std::vector<std::string> ops = [] {
    std::vector<std::string> names;
    for (const OpDef* op : op_table())
      if (op->spec().replay_cacheable) names.push_back(op->name());
    return names;
  }();
  return ops;
}

bool replay_cacheable(const std::string& op) {
  const auto& ops = replay_cacheable_ops();
  return std::find(ops.begin(), ops.end(), op) != ops.end();
}

std::string replay_cacheable_list() {
  std::string s;
  for (const auto& op : replay_cacheable_ops()) s += (s.empty() ? "" : ", ") + op;
  return s;
}

Policy recompute_all() {
  return [](const std::string&) { return SaveDecision::prefer_recompute; };
}

Policy save_ops(std::vector<std::string> ops) {
  REMAT_CHECK(!ops.empty(), Error, "save_ops: no op names given; valid ops: ", replay_cacheable_list());
  for (const auto& op : ops)
    REMAT_CHECK(replay_cacheable(op), Error, "save_ops: op '", op,
                "' cannot hand back cached outputs (a replay would run its kernel anyway, so keeping its "
                "outputs would only hold memory); valid ops: ", replay_cacheable_list());
  return [ops = std::move(ops)](const std::string& op) {
    return std::find(ops.begin(), ops.end(), op) != ops.end() ? SaveDecision::must_save
                                                              : SaveDecision::prefer_recompute;
  };
}

Policy save_matmul_outputs() { return save_ops({"matmul"}); }
Policy save_attention_outputs() { return save_ops({"scaled_dot_product_attention"}); }

}  // namespace remat
