// The fine-tuning flags train, dump and mem share (docs/REFERENCE.md#fine-tuning):
// --lora SPEC (models/lora.h) and --freeze PATTERN[,PATTERN]; and --adapter
// DIR (train, eval, generate, dump: a PEFT adapter folder, train/adapter_files.h).
#pragma once

#include <vector>

#include "models/config.h"
#include "tools/args.h"

namespace remat::tools {

std::vector<FlagSpec> fine_tune_flag_specs();
// Sets c.lora and c.freeze from the flags given (Error naming a bad --lora
// key or value, or an empty --freeze pattern); leaves them alone otherwise.
void apply_fine_tune_flags(const Flags& f, ModelConfig& c);

FlagSpec adapter_flag_spec();
// The --adapter folder ("" when not given), its config read and set as
// c.lora. Error when --model is not given (the adapter's base) or --lora is
// given and differs from the adapter's (--adapter brings its own; an equal
// --lora is accepted); the reader's errors for a bad folder.
std::string apply_adapter_flag(const Flags& f, ModelConfig& c);

}  // namespace remat::tools
