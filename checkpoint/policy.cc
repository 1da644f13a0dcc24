#include "checkpoint/policy.h"

#include <algorithm>

#include "engine/error.h"

namespace remat {

const std::vector<std::string>& replay_cacheable_ops() {
  // Keep in step with the ops in ops/ whose dispatched body computes its
  // result through kernel_or_cached (ops/matmul.cc, ops/attention.cc);
  // tests/checkpoint/policy_test.cc checks that each one really skips.
  static const std::vector<std::string> ops{"matmul", "scaled_dot_product_attention"};
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
