// Hugging Face config.json <-> ModelConfig for the architectures remat runs:
// LlamaForCausalLM, Qwen2ForCausalLM, Qwen2MoeForCausalLM and
// MixtralForCausalLM (docs/REFERENCE.md#models-and-configs lists the keys and
// what each becomes).
#pragma once

#include <string>
#include <vector>

#include "engine/json.h"
#include "models/config.h"

namespace remat {

struct HfConfig {
  ModelConfig config;
  // Keys remat does not model and that do not change the math (kept in
  // config.hf_extra and written back on export), for a note to the user.
  std::vector<std::string> passed_through;
};

// The ModelConfig of a parsed config.json (`what` names it in errors). A
// key whose value changes the math in a way remat does not implement
// (rope_scaling, sliding windows, another activation, MLP biases, dropout in
// attention, router jitter, partial rotary) is an Error naming the key and
// its value; a missing required key (hidden_size, ...) or a value of the
// wrong type is an Error naming it. seq and batch keep ModelConfig's
// defaults (the caller sets them); aux_coef is router_aux_loss_coef.
HfConfig config_from_hf(const Json& j, const std::string& what = "config.json");

// The config.json of `c` (c.arch must be set, or "" for a dense remat
// decoder, written as Llama): c.hf_extra's keys, then every key the
// architecture reads, with torch_dtype `dtype_name` ("float32", "bfloat16",
// "float16"). Throws Error for a config no HF class expresses (remat's own
// MoE decoder).
Json config_to_hf(const ModelConfig& c, const std::string& dtype_name);

}  // namespace remat
