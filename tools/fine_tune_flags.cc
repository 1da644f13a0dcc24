#include "tools/fine_tune_flags.h"

#include <sstream>

#include "train/adapter_files.h"

namespace remat::tools {

std::vector<FlagSpec> fine_tune_flag_specs() {
  return {text_flag("lora", "LoRA adapters, PEFT semantics: r=R[,alpha=A][,dropout=P][,targets=NAME,...] (alpha "
                    "default 2R, dropout 0, targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj); "
                    "every other parameter is frozen"),
          text_flag("freeze", "freeze the parameters matching these globs (comma-separated; '*' any run, '?' one "
                    "character, [A-B] a number range: model.embed_tokens.*,model.layers.[0-11].*)")};
}

void apply_fine_tune_flags(const Flags& f, ModelConfig& c) {
  if (f.has("lora")) c.lora = LoraConfig::parse(f.get("lora"));
  if (f.has("freeze")) {
    c.freeze.clear();
    std::stringstream in(f.get("freeze"));
    for (std::string p; std::getline(in, p, ',');) {
      REMAT_CHECK(!p.empty(), Error, "--freeze '", f.get("freeze"), "': an empty pattern between commas");
      c.freeze.push_back(p);
    }
    REMAT_CHECK(!c.freeze.empty(), Error, "--freeze: no pattern given");
  }
}

FlagSpec adapter_flag_spec() {
  return text_flag("adapter", "a PEFT LoRA adapter folder (adapter_config.json, adapter_model.safetensors) over "
                   "the --model base: its adapters are built and loaded (for further training, eval or generate)");
}

std::string apply_adapter_flag(const Flags& f, ModelConfig& c) {
  if (!f.has("adapter")) return "";
  const std::string dir = f.get("adapter");
  const AdapterConfig a = read_adapter_config(dir);
  REMAT_CHECK(f.has("model"), Error, "--adapter ", dir, " needs --model BASE, the Hugging Face folder it adapts (its ",
              kAdapterConfigFile, " names ", a.base_model.empty() ? std::string("none") : "'" + a.base_model + "'", ")");
  if (f.has("lora")) {
    const LoraConfig given = LoraConfig::parse(f.get("lora"));
    REMAT_CHECK(same_adapters(given, a.lora), Error, "--lora ", f.get("lora"), " and --adapter ", dir,
                " disagree: the adapter is LoRA ", a.lora.str(), "; drop --lora (--adapter brings its own config)");
  }
  c.lora = a.lora;
  return dir;
}

}  // namespace remat::tools
