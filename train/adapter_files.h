// LoRA adapters as Hugging Face PEFT folders (docs/REFERENCE.md#adapter-folders):
//   DIR/adapter_config.json        PEFT's LoraConfig ("peft_type": "LORA", "r",
//                                  "lora_alpha", "lora_dropout", "target_modules", ...)
//   DIR/adapter_model.safetensors  "base_model.model.<remat name>" for every
//                                  adapter parameter (models/lora.h), e.g.
//                                  base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight
// and the merge of an adapter into its base weights, W + (alpha / r) B A.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/dtype.h"
#include "engine/tensor.h"
#include "models/decoder.h"
#include "models/lora.h"
#include "train/hf_files.h"

namespace remat {

inline constexpr const char* kAdapterConfigFile = "adapter_config.json";
inline constexpr const char* kAdapterWeightsFile = "adapter_model.safetensors";
inline constexpr const char* kPeftPrefix = "base_model.model.";

// What remat reads from an adapter_config.json.
struct AdapterConfig {
  LoraConfig lora;         // r, lora_alpha, lora_dropout, target_modules
  std::string base_model;  // base_model_name_or_path ("" when null)
};

// Whether two LoRA configs give the same adapters: r, alpha, dropout and
// the targets as a set (PEFT keeps target_modules as a set; its order is
// arbitrary).
bool same_adapters(const LoraConfig& a, const LoraConfig& b);

// The adapter_config.json text PEFT writes for `lora` over `base_model`
// (keys sorted, as PEFT's to_json_string; compact).
std::string adapter_config_json(const LoraConfig& lora, const std::string& base_model);

// Reads DIR/adapter_config.json. IOError for a missing file or bad JSON;
// Error naming the key for a value of the wrong type or range and for
// features remat does not have (DoRA, rsLoRA, biases, fan_in_fan_out,
// modules_to_save, rank / alpha patterns, layers_to_transform, a regex
// target_modules, a peft_type other than LORA, a task_type other than
// CAUSAL_LM, ...).
AdapterConfig read_adapter_config(const std::string& dir);

// Writes an adapter folder DIR (created if missing): the adapter parameters
// of `parameters` (one process's layout: every expert; others are skipped)
// converted to `dtype` (f32, bf16 or f16), and the config. The old
// adapter_config.json goes first and the new one comes last, each file
// written atomically, so an interrupted save leaves no config over new
// weights. Error when `parameters` holds no adapter; IOError on a write failure.
void save_adapter(const std::string& dir, const LoraConfig& lora,
                  const std::vector<std::pair<std::string, Tensor>>& parameters, const std::string& base_model,
                  DType dtype = DType::f32);

// Loads DIR's adapter into `model`, which must have been built with its
// config (model.config().lora equal to read_adapter_config(DIR).lora up to
// the order of the targets: Error otherwise). Names may be PEFT's
// ("base_model.model.X") or carry the adapter name ("...lora_A.default.weight");
// any floating dtype, widened to f32. Before any value changes it checks, and
// throws IOError naming the folder: every adapter parameter of the model is
// in the file, every tensor of the file is one (a routed expert another
// expert-parallel rank holds excepted), shapes agree (naming the tensor and
// both shapes: probably an adapter for another base model). On meta: the
// checks only.
void load_adapter(DecoderModel& model, const std::string& dir);

// `parameters` of a LoRA model with every adapted weight W replaced by
// W + scaling B A (computed in f32 when read: one weight and its two
// adapter tensors held at a time) and the adapter tensors left out: the
// weights of the model without adapters. Error when an adapter's weight is
// not among `parameters`.
std::vector<HfTensorSource> merge_lora(const std::vector<HfTensorSource>& parameters, const LoraConfig& lora);

// `c` without its adapters and frozen parameters (the config of a merged model).
ModelConfig without_adapters(ModelConfig c);

}  // namespace remat
