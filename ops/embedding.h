// Embedding lookup: rows of a table gathered by integer ids.
#pragma once

#include "engine/tensor.h"

namespace remat {

// weight [V, d] floating, ids i32/i64 of any shape with values in [0, V) ->
// [ids..., d] in weight's dtype. The weight gradient scatter-adds the output
// gradient rows, in a fixed order (deterministic). Saves ids only.
Tensor embedding(const Tensor& weight, const Tensor& ids);

}  // namespace remat
