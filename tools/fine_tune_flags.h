// The fine-tuning flags train, dump and mem share (docs/REFERENCE.md#fine-tuning):
// --lora SPEC (models/lora.h) and --freeze PATTERN[,PATTERN].
#pragma once

#include <vector>

#include "models/config.h"
#include "tools/args.h"

namespace remat::tools {

std::vector<FlagSpec> fine_tune_flag_specs();
// Sets c.lora and c.freeze from the flags given (Error naming a bad --lora
// key or value, or an empty --freeze pattern); leaves them alone otherwise.
void apply_fine_tune_flags(const Flags& f, ModelConfig& c);

}  // namespace remat::tools
