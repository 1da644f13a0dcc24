// The FLOP figures behind ./remat bench's MFU and HFU: a model's matmul
// FLOPs per training step, and the peak of the device they are measured
// against.
#pragma once

#include <cstdint>

#include "engine/device.h"
#include "engine/dtype.h"
#include "models/decoder.h"

namespace remat::tools {

// Model FLOPs of one training step of the global batch (PaLM, Chowdhery et
// al. 2022, appendix B): 6 N per token for the matmuls, N the parameters that
// do matmul work (all but the embedding table, routed experts counted at
// top_k / experts), plus 12 L d S per token for attention. `ep`: `m` holds
// 1/ep of the experts (expert parallel). `seq`: the batch's tokens per
// sequence S (0: the config's).
double model_flops(const DecoderModel& m, std::int64_t ep = 1, std::int64_t seq = 0);

// The best of `tries` 1024^3 f32 GEMMs, in FLOP/s: the machine's practical
// peak. bench measures it (10 tries) before and after its runs, and each CPU
// worker probes it (5 tries) after its timed steps; the highest figure is the
// peak, so a moment of other load cannot lower it (which would inflate MFU).
double measure_peak_flops(int tries = 10);

// A CUDA device's dense peak for compute dtype `dtype`, in FLOP/s.
double cuda_peak_flops(Device device, DType dtype);

}  // namespace remat::tools
