// Hugging Face model folders as remat models: config.json (models/hf_config.h)
// and the weights (train/hf_files.h: one model.safetensors or shards with an
// index; F32, BF16 or F16), loaded a tensor at a time into a DecoderModel's
// f32 parameters, and written back as a folder Hugging Face and remat load.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/decoder.h"
#include "models/hf_config.h"
#include "train/hf_files.h"

namespace remat {

// True when `dir` is a folder holding a config.json (a Hugging Face model).
bool is_hf_model_dir(const std::string& dir);

// True when folder `dir` holds a tokenizer.json or tokenizer.model.
bool has_tokenizer_files(const std::string& dir);

// DIR/config.json as a ModelConfig (seq and batch at their defaults: the
// caller sets them). IOError when the file is missing or not JSON; Error
// naming the key for an unsupported architecture or setting.
HfConfig load_hf_config(const std::string& dir);

// "float32", "bfloat16" or "float16": the dtype most of DIR's floating
// tensors are stored in (for export defaults and messages).
std::string hf_weights_dtype(const std::string& dir);

// Copies the weights of folder `dir` into `model` (each converted to f32 and
// read on its own, so loading needs the model plus its largest tensor).
// Every parameter of the model must be in the folder with its shape, and
// every tensor of the folder must be a parameter of the model (under expert
// parallelism: or a routed expert another rank holds); otherwise an IOError
// lists the missing, unexpected and mis-shaped tensors (the first few of
// each, with counts) before any parameter is changed. A model on meta reads
// the headers only (the same checks; no tensor data).
// LoRA adapters (models/lora.h) are not read: they keep their initial values.
// Frozen parameters take the folder's bf16 / f16 (keep_frozen_in_folder_dtypes).
void load_hf_weights(DecoderModel& model, const std::string& dir);

// Converts every frozen parameter (requires_grad false) that the folder at
// `dir` holds in bf16 or f16 to that dtype, reading headers only (the values
// are converted, not read): no f32 master for a weight that never updates.
void keep_frozen_in_folder_dtypes(const DecoderModel& model, const std::string& dir);

// True when `name` is a routed expert's parameter ("model.layers.L.mlp.
// experts.E..." and Mixtral's) that another expert-parallel rank holds: an
// expert of the model's config that `model` (one rank's placement) lacks.
bool held_by_another_rank(const DecoderModel& model, const std::string& name);

// The model of folder `dir` with its weights, seq and batch set on its
// config, built on `device` (meta: config.json and the headers only). With
// `lora` enabled the model gets those adapters (models/lora.h; their initial
// values: load_adapter, train/adapter_files.h, fills them).
std::unique_ptr<DecoderModel> load_hf_model(const std::string& dir, std::int64_t batch, std::int64_t seq,
                                            Device device = kCPU, const LoraConfig& lora = {});

struct HfExportOptions {
  DType dtype = DType::f32;                         // weights' dtype in the files
  std::int64_t max_shard_bytes = 5'000'000'000;     // above this the weights are sharded (HF's 5 GB)
  std::string tokenizer;                            // a tokenizer.json / .model, or a folder: its files are copied
  // export_trained_state of a LoRA state: merge the adapters into the
  // weights (train/adapter_files.h merge_lora); without it such a state is
  // refused (a Hugging Face folder has no place for adapters).
  bool merge_adapter = false;
};

// Writes a Hugging Face folder to `dir` (created if missing): config.json
// for `c` (models/hf_config.h: config_to_hf), the named parameters (one
// process's layout: every expert) as safetensors (sharded with an index above
// max_shard_bytes), and the tokenizer's files when given (tokenizer.json,
// tokenizer_config.json, special_tokens_map.json, tokenizer.model,
// generation_config.json, whichever exist). A config with LoRA adapters is
// refused (Error: merge them first, merge_lora). An old config.json is removed
// first and the new one written last: an interrupted export leaves the old
// model or a folder without config.json that refuses to load, never new
// weights under an old config (steps: ExportStep, train/hf_files.h). Throws
// Error / IOError.
void save_hf_model(const std::string& dir, const ModelConfig& c,
                   const std::vector<std::pair<std::string, Tensor>>& parameters, const HfExportOptions& options);
// The same with each parameter read when it is written (one at a time:
// a sharded state's export, train/sharded_state.h).
void save_hf_model(const std::string& dir, const ModelConfig& c, const std::vector<HfTensorSource>& parameters,
                   const HfExportOptions& options);

// "f32" / "bf16" / "f16" (also "float32", "bfloat16", "float16") -> dtype;
// Error otherwise.
DType hf_dtype_from_name(const std::string& name);

}  // namespace remat
