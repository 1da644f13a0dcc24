// Finite-difference gradient checks, for users' custom ops (engine/custom_op.h)
// and remat's own op tests.
//
// gradcheck(f, inputs) makes each checked input a fresh leaf that requires
// grad, computes L = sum(f(inputs) * R) for a fixed random R, and compares
// dL/dx from backward with central differences (L evaluated in double from
// f's outputs, with f run under no-grad): element by element for small inputs
// (a fixed subset of max_elements elements for larger ones), plus one random
// directional derivative over all elements. An element passes when
// |numeric - analytic| <= atol + rtol * max(|numeric|, |analytic|); the
// directional derivative gets 4 * atol. The defaults suit f32 ops with
// outputs of order one; they are far tighter than any wrong backward (a
// missing term, a transposed operand, a wrong sign or factor) can meet.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace remat {

struct GradcheckOptions {
  double eps = 1e-2;               // central-difference step
  double atol = 2e-3;
  double rtol = 2e-2;
  std::int64_t max_elements = 64;  // per input, element-wise checks
  std::vector<bool> check;         // which inputs to check (default: the floating ones)
};

struct GradcheckResult {
  bool ok = true;
  std::int64_t checked = 0;             // comparisons made
  double max_abs_error = 0;             // largest |numeric - analytic|
  std::vector<std::string> failures;    // one line per failed comparison
  // "gradcheck: 70 comparisons, max |error| 1.2e-05, all within tolerance" or
  // the failures, one per line (the first 20).
  std::string report() const;
  explicit operator bool() const { return ok; }
};

using GradcheckFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Checks f's gradients at `inputs` (undefined and integer inputs pass through
// unchecked). Throws AutogradError if f's output does not require grad or an
// input gets no gradient; numeric mismatches are reported, not thrown.
GradcheckResult gradcheck(const GradcheckFn& f, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options = {});

}  // namespace remat
