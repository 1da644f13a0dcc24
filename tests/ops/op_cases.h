// One list of test cases covering every op in the op table, in the spirit of
// ggml's test-backend-ops: each case builds small CPU inputs, calls its op,
// and says how to check it. tests/ops/op_coverage_test.cc runs every case's
// finite-difference gradient check on the CPU and requires a case for every
// op; tests/cuda/op_compare_test.cc runs every case that has a CUDA tolerance
// on the CPU and on a GPU and compares outputs and gradients.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/gradcheck.h"
#include "engine/tensor.h"

namespace remat::testing {

struct CaseTolerance {
  double rtol = 1e-5;
  double atol = 1e-6;
};

struct OpCase {
  std::string op;    // the op table name the case exercises (it must call it)
  std::string what;  // a few words: the shape or variant
  std::function<std::vector<Tensor>()> inputs;  // fresh CPU inputs (f32 floating, i64 indices)
  GradcheckFn fn;                               // calls the op on the inputs; one output
  // The finite-difference check's options; nullopt: the op is not
  // differentiable (the case still runs it forward).
  std::optional<GradcheckOptions> grad = GradcheckOptions{};
  // Compared between the CPU and CUDA with this tolerance; nullopt: not
  // compared (the op has no CUDA path; the reason is in op_cases.cc).
  std::optional<CaseTolerance> cuda = CaseTolerance{};
};

// Every case, grouped by op.
const std::vector<OpCase>& op_cases();

}  // namespace remat::testing
