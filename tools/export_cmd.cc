// ./remat export: a training state as a Hugging Face model folder
// (config.json, safetensors weights, the tokenizer's files).
#include <cstdio>

#include "engine/allocator.h"
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
  HfExportOptions o;
  o.dtype = hf_dtype_from_name(f.get("dtype"));
  o.max_shard_bytes = std::int64_t(f.get_double("max-shard-mb") * 1e6);
  o.tokenizer = f.has("tokenizer") ? f.get("tokenizer") : "";  // (empty: the state's own, if any)
  // A parameter at a time from the state's files (a sharded set's too).
  std::int64_t parameters = 0;
  const std::map<std::string, std::string> meta = export_trained_state(f.get("resume"), f.get("out"), o, &parameters);
  std::printf("export: %s (step %s, %lld parameters) -> %s (%s weights%s; at most %.1f MiB allocated: one tensor at a "
              "time)\n",
              f.get("resume").c_str(), meta.count("step") ? meta.at("step").c_str() : "?",
              static_cast<long long>(parameters), f.get("out").c_str(), dtype_name(o.dtype),
              !o.tokenizer.empty() || (meta.count("tokenizer") && !meta.at("tokenizer").empty()) ? ", tokenizer copied" : "",
              double(allocator_for(kCPU).stats().allocated_peak) / 1048576.0);
  return 0;
}

}  // namespace remat::tools
