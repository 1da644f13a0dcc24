// Every case of tests/ops/op_cases.cc that has a CUDA tolerance, run on the
// CPU and on CUDA device 0 from the same inputs: outputs and input gradients
// compared element by element (tests/cuda/device_compare.h). Without a GPU
// the test main lists the case as skipped.
#include <catch2/catch.hpp>

#include "tests/cuda/device_compare.h"
#include "tests/ops/op_cases.h"

using namespace remat;
using namespace remat::testing;

TEST_CASE("every op's case gives the CPU's results on CUDA", "[cuda][ops][coverage]") {
  for (const OpCase& c : op_cases()) {
    if (!c.cuda) continue;
    INFO(c.op << " (" << c.what << ")");
    compare_on_cuda(c.fn, c.inputs(), DeviceTolerance{c.cuda->rtol, c.cuda->atol});
  }
}
