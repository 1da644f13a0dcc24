// Model configurations: the named configs of
// docs/REFERENCE.md#models-and-configs and JSON files with the same keys.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/json.h"
#include "models/lora.h"

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
  // Balanced routes: token t's k-th slot goes to expert (t K + k) mod E, so
  // every expert gets T K / E slots and none drops ("uniform routes"; the
  // routes a meta run assumes whatever the router picks, docs/META.md).
  bool balanced_routing = false;

  // Hugging Face architectures (docs/REFERENCE.md#models-and-configs). Every
  // default below is remat's own decoder; JSON keys at their defaults are left
  // out of to_json().
  std::string arch;               // "" (remat), "llama", "qwen2", "qwen2_moe" or "mixtral": names and export
  std::int64_t kv_heads = 0;      // key/value heads, dividing n_heads (0: n_heads; fewer: grouped-query)
  std::int64_t head_size = 0;     // per-head dim (0: d_model / n_heads)
  bool tie_embeddings = false;    // the LM head is model.embed_tokens.weight
  bool qkv_bias = false;          // biases on q_proj, k_proj, v_proj
  bool o_bias = false;            // bias on o_proj
  std::int64_t shared_ffn = 0;    // shared expert hidden size (0: moe_ffn * shared)
  bool shared_gate = false;       // the shared expert's output times sigmoid(x . shared_expert_gate)
  bool norm_topk = true;          // renormalise the top-K routing weights to sum to 1
  std::int64_t sparse_step = 1;   // MoE blocks where (i + 1) % sparse_step == 0
  std::vector<std::int64_t> dense_layers;  // blocks that keep the dense MLP (HF mlp_only_layers)
  std::string hf_extra;           // a JSON object: a loaded config.json's other keys, written back on export

  // Fine-tuning (docs/REFERENCE.md#fine-tuning): LoRA adapters (models/lora.h;
  // every other parameter frozen) and the parameters to freeze, as globs
  // over parameter names (models/module.h name_matches). JSON keys "lora"
  // (its --lora spec) and "freeze" (an array), left out when unset.
  LoraConfig lora;
  std::vector<std::string> freeze;

  std::int64_t head_dim() const { return head_size > 0 ? head_size : d_model / n_heads; }
  std::int64_t num_kv_heads() const { return kv_heads > 0 ? kv_heads : n_heads; }
  std::int64_t shared_hidden() const { return shared_ffn > 0 ? shared_ffn : moe_ffn * shared; }
  bool is_moe_layer(std::int64_t i) const;

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
