#include "tools/fine_tune_flags.h"

#include <sstream>

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

}  // namespace remat::tools
