// Model configurations: the named configs of DESIGN.md §7 and JSON files
// with the same keys.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/json.h"

namespace remat {

struct ModelConfig {
  std::string name = "custom";
  std::int64_t vocab = 256;
  std::int64_t d_model = 128;
  std::int64_t n_layers = 4;
  std::int64_t n_heads = 4;
  std::int64_t ffn = 344;
  std::int64_t seq = 128;
  std::int64_t batch = 8;
  // Mixture of experts (0 experts: every block is dense).
  std::int64_t experts = 0;
  std::int64_t top_k = 0;
  std::int64_t moe_ffn = 0;
  std::int64_t shared = 0;       // shared experts (hidden moe_ffn * shared)
  std::int64_t dense_first = 0;  // leading blocks that use the dense MLP
  double dropout = 0.0;          // on attention and MLP outputs
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  double init_std = 0.02;
  double aux_coef = 0.01;        // load-balancing loss coefficient
  double z_coef = 0.0;           // router z-loss coefficient
  double capacity_factor = 0.0;  // 0: dropless; else each expert keeps ceil(cf * T * K / E) rows
  bool random_routing = false;   // uniform random routes (seeded; for benchmarks)

  std::int64_t head_dim() const { return d_model / n_heads; }
  bool is_moe_layer(std::int64_t i) const { return experts > 0 && i >= dense_first; }

  // Checks the values are consistent; throws Error listing what is wrong.
  void validate() const;
  Json to_json() const;

  // A named config ("tiny", "tiny-moe", "bench-dense", "bench-moe"); throws
  // Error listing the valid names.
  static ModelConfig named(const std::string& name);
  // A JSON object with the keys of to_json() (missing keys keep defaults;
  // unknown keys are an error listing the valid ones).
  static ModelConfig from_json(const Json& j);
  // A name, or a path to a .json file.
  static ModelConfig load(const std::string& name_or_path);
  static std::vector<std::string> names();
};

}  // namespace remat
