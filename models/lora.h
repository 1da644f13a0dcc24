// LoRA (Hu et al. 2021, arXiv:2106.09685) with the semantics of Hugging
// Face PEFT: a targeted Linear computes
//   y = x W^T (+ b) + scaling * ((dropout(x) A^T) B^T),  scaling = alpha / r
// with A [r, in] drawn Kaiming-uniform (a = sqrt(5): U(-1/sqrt(in),
// 1/sqrt(in)), PEFT's default) and B [out, r] zero, so a fresh adapter
// changes nothing. The adapters are parameters "<linear>.lora_A.weight" and
// "<linear>.lora_B.weight" (PEFT's names without "base_model.model." and the
// adapter name); every other parameter of the model is frozen.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace remat {

class Module;

struct LoraConfig {
  std::int64_t r = 0;  // 0: no adapters
  double alpha = 0;
  double dropout = 0;
  // The Linear modules to adapt, by the last part of their name (q_proj,
  // k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; Mixtral's experts
  // w1, w2, w3; lm_head).
  std::vector<std::string> targets;

  bool enabled() const { return r > 0; }
  double scaling() const { return alpha / double(r); }
  // "r=16,alpha=32,dropout=0.05,targets=q_proj,k_proj,v_proj" (the
  // --lora value; the names after targets= run to the end). Defaults: alpha
  // = 2 r, dropout 0, targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,
  // down_proj. Throws Error naming the bad key or value (r < 1, alpha <= 0,
  // dropout outside [0, 1), an empty target).
  static LoraConfig parse(const std::string& spec);
  // The canonical spec parse() turns back into an equal config ("" when off).
  std::string str() const;
  bool operator==(const LoraConfig&) const = default;
};

// The default targets: every projection of attention and the MLPs.
const std::vector<std::string>& default_lora_targets();

// Adds an adapter to every Linear of `model` whose name ends in a target and
// freezes every other parameter. An adapter's A is drawn from a Philox stream
// keyed by `seed` and the parameter's name (the same values whatever else
// the model holds: an expert-parallel rank's experts, a pipeline stage).
// Throws Error, before changing anything, naming a target that matches no
// Linear (listing the Linear names the model has) or a Linear whose weight
// the model reads other than through Linear::forward (the MoE router
// "gate"). Returns the adapted Linear names.
std::vector<std::string> apply_lora(Module& model, const LoraConfig& config, std::uint64_t seed);

// Whether `name` is a LoRA adapter parameter (".lora_A." / ".lora_B.").
bool is_lora_parameter(const std::string& name);

}  // namespace remat
