// Applying a recompute plan (checkpoint/plan.h) to a decoder: block-level
// regions through the model's block runner, module regions through each
// block's region wrap.
#pragma once

#include "checkpoint/plan.h"
#include "models/decoder.h"

namespace remat {

// Makes `model` run with `plan` from now on (replacing any earlier plan).
// Throws Error if the plan names parts the model does not have (MoE parts on
// a dense model).
void apply_recompute_plan(DecoderModel& model, const RecomputePlan& plan);

}  // namespace remat
