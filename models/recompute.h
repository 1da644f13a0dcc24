// Applying a recompute plan (checkpoint/plan.h) to a decoder: its blocks are
// a BlockStack (models/block_stack.h), which runs the plan.
#pragma once

#include "checkpoint/plan.h"
#include "models/decoder.h"

namespace remat {

// Makes `model` run with `plan` from now on (replacing any earlier plan).
// Throws Error if the plan names parts the model does not have (MoE parts on
// a dense model).
void apply_recompute_plan(DecoderModel& model, const RecomputePlan& plan);

}  // namespace remat
