#include "checkpoint/policy.h"

#include <algorithm>

namespace remat {

Policy recompute_all() {
  return [](const std::string&) { return SaveDecision::prefer_recompute; };
}

Policy save_ops(std::vector<std::string> ops) {
  return [ops = std::move(ops)](const std::string& op) {
    return std::find(ops.begin(), ops.end(), op) != ops.end() ? SaveDecision::must_save
                                                              : SaveDecision::prefer_recompute;
  };
}

Policy save_matmul_outputs() { return save_ops({"matmul"}); }
Policy save_attention_outputs() { return save_ops({"scaled_dot_product_attention"}); }

}  // namespace remat
