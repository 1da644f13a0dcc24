// ./remat export: a training state as a Hugging Face model folder
// (config.json, safetensors weights, the tokenizer's files).
#include <cstdio>

#include "engine/error.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "train/hf_model.h"
#include "train/trainer.h"

namespace remat::tools {

int run_export(const std::vector<std::string>& args) {
  Flags f("export", "write a training state as a Hugging Face model folder", args,
          {text_flag("resume", "the training state folder (required)"),
           text_flag("out", "the Hugging Face folder to write (required; created if missing)"),
           text_flag("dtype", "weights dtype: f32, bf16 or f16", "f32"),
           number_flag("max-shard-mb", "shard the weights into files of at most this many MB (10^6 bytes)", 5000,
                       {.min = 0, .min_open = true}),
           text_flag("tokenizer", "tokenizer files to copy (a folder, tokenizer.json or tokenizer.model; default: the "
                     "one the state was trained with, if any)")});
  REMAT_CHECK(f.has("resume"), Error, "export: --resume DIR is required (a folder written by train --save)");
  REMAT_CHECK(f.has("out"), Error, "export: --out DIR is required");
  std::map<std::string, std::string> meta;
  const auto model = load_trained_model(f.get("resume"), &meta);
  HfExportOptions o;
  o.dtype = hf_dtype_from_name(f.get("dtype"));
  o.max_shard_bytes = std::int64_t(f.get_double("max-shard-mb") * 1e6);
  o.tokenizer = f.has("tokenizer") ? f.get("tokenizer") : meta.count("tokenizer") ? meta.at("tokenizer") : "";
  save_hf_model(f.get("out"), model->config(), model->named_parameters(), o);
  std::printf("export: %s (step %s, %lld parameters) -> %s (%s weights%s)\n", f.get("resume").c_str(),
              meta.count("step") ? meta.at("step").c_str() : "?", static_cast<long long>(model->num_parameters()),
              f.get("out").c_str(), dtype_name(o.dtype), o.tokenizer.empty() ? "" : ", tokenizer copied");
  return 0;
}

}  // namespace remat::tools
