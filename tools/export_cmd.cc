// ./remat export: a training state as a Hugging Face model folder
// (config.json, safetensors weights, the tokenizer's files); a LoRA state's
// adapters merged into it (--merge-adapter) or alone as a PEFT adapter folder
// (--adapter-only); or a PEFT adapter folder merged into its base folder
// (--model BASE --adapter DIR --merge-adapter).
#include <cstdio>

#include "engine/allocator.h"
#include "engine/error.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "train/adapter_files.h"
#include "train/hf_model.h"
#include "train/trainer.h"

namespace remat::tools {

namespace {

std::vector<FlagSpec> export_flag_specs() {
  return {text_flag("resume", "the training state folder (this, or --model with --adapter)"),
          text_flag("out", "the Hugging Face folder to write (required; created if missing)"),
          text_flag("dtype", "weights dtype: f32, bf16 or f16", "f32"),
          number_flag("max-shard-mb", "shard the weights into files of at most this many MB (10^6 bytes)", 5000,
                      {.min = 0, .min_open = true}),
          text_flag("tokenizer", "tokenizer files to copy (a folder, tokenizer.json or tokenizer.model; default: the "
                    "one the state was trained with, or --model's)"),
          bool_flag("merge-adapter", "a LoRA model: write W + (alpha/r) B A for every adapted weight (computed in f32, "
                    "then cast to --dtype) and no adapter tensors; a LoRA state needs this or --adapter-only"),
          bool_flag("adapter-only", "a LoRA state: write its adapters alone as a PEFT adapter folder "
                    "(adapter_config.json, adapter_model.safetensors; --model names its base)"),
          text_flag("model", "with --adapter --merge-adapter: the base Hugging Face folder; with --adapter-only: the "
                    "base recorded as base_model_name_or_path"),
          text_flag("adapter", "with --model and --merge-adapter: the PEFT adapter folder to merge (no state)")};
}

// --model BASE --adapter DIR --merge-adapter: the base and the adapter loaded
// whole (as generate loads them), merged, written.
void export_merged_adapter_folder(const Flags& f, const HfExportOptions& o) {
  REMAT_CHECK(f.has("model") && f.get_bool("merge-adapter"), Error,
              "export --adapter DIR: give --model BASE (the folder it adapts) and --merge-adapter");
  const LoraConfig lora = read_adapter_config(f.get("adapter")).lora;
  const auto model = load_hf_model(f.get("model"), 1, 1, kCPU, lora);
  load_adapter(*model, f.get("adapter"));
  HfExportOptions with_tokenizer = o;
  if (with_tokenizer.tokenizer.empty() && has_tokenizer_files(f.get("model"))) with_tokenizer.tokenizer = f.get("model");
  save_hf_model(f.get("out"), without_adapters(model->config()), merge_lora(hf_sources(model->named_parameters()), lora),
                with_tokenizer);
  std::printf("export: %s + adapter %s (LoRA %s) -> %s (%s weights, the adapters merged)\n", f.get("model").c_str(),
              f.get("adapter").c_str(), lora.str().c_str(), f.get("out").c_str(), dtype_name(o.dtype));
}

}  // namespace

int run_export(const std::vector<std::string>& args) {
  Flags f("export", "write a training state as a Hugging Face model folder", args, export_flag_specs());
  REMAT_CHECK(f.has("out"), Error, "export: --out DIR is required");
  HfExportOptions o;
  o.dtype = hf_dtype_from_name(f.get("dtype"));
  o.max_shard_bytes = std::int64_t(f.get_double("max-shard-mb") * 1e6);
  o.tokenizer = f.has("tokenizer") ? f.get("tokenizer") : "";  // (empty: the state's own, if any)
  o.merge_adapter = f.get_bool("merge-adapter");
  REMAT_CHECK(!f.has("resume") || !f.has("adapter"), Error, "export: --adapter DIR merges a PEFT folder into --model "
              "BASE; a state's adapters are in the state (drop --adapter)");
  REMAT_CHECK(!f.has("model") || f.has("adapter") || f.get_bool("adapter-only"), Error, "export: --model BASE goes "
              "with --adapter DIR (a PEFT folder to merge into it) or --adapter-only (the base to record)");
  if (f.has("adapter")) {
    export_merged_adapter_folder(f, o);
    return 0;
  }
  REMAT_CHECK(f.has("resume"), Error, "export: --resume DIR is required (a folder written by train --save)");
  if (f.get_bool("adapter-only")) {
    REMAT_CHECK(!o.merge_adapter, Error, "export: --adapter-only and --merge-adapter exclude each other");
    export_trained_adapter(f.get("resume"), f.get("out"), f.get("model"), o.dtype);
    std::printf("export: the LoRA adapters of %s -> %s (%s)\n", f.get("resume").c_str(), f.get("out").c_str(),
                dtype_name(o.dtype));
    return 0;
  }
  // A parameter at a time from the state's files (a sharded set's too).
  std::int64_t parameters = 0;
  const std::map<std::string, std::string> meta = export_trained_state(f.get("resume"), f.get("out"), o, &parameters);
  std::printf("export: %s (step %s, %lld parameters) -> %s (%s weights%s%s; at most %.1f MiB allocated: one tensor at "
              "a time)\n",
              f.get("resume").c_str(), meta.count("step") ? meta.at("step").c_str() : "?",
              static_cast<long long>(parameters), f.get("out").c_str(), dtype_name(o.dtype),
              o.merge_adapter ? ", the LoRA adapters merged" : "",
              !o.tokenizer.empty() || (meta.count("tokenizer") && !meta.at("tokenizer").empty()) ? ", tokenizer copied" : "",
              double(allocator_for(kCPU).stats().allocated_peak) / 1048576.0);
  return 0;
}

}  // namespace remat::tools
