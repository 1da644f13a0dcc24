#include "tools/bench_flops.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "engine/device_runtime.h"
#include "ops/matmul.h"

namespace remat::tools {

namespace {

// Parameters that do matmul work for each token: everything but the
// embedding table, with routed experts counted at top_k / experts.
// `ep`: the model holds 1/ep of the experts (expert parallel).
double active_params(const DecoderModel& m, std::int64_t ep) {
  const ModelConfig& c = m.config();
  double n = 0;
  for (const auto& [name, p] : m.named_parameters()) {
    if (name == "model.embed_tokens.weight") continue;
    if (name.find(".mlp.experts.") != std::string::npos)
      n += double(p.numel()) * double(c.top_k) * double(ep) / double(c.experts);
    else
      n += double(p.numel());
  }
  return n;
}

}  // namespace

double model_flops(const DecoderModel& m, std::int64_t ep, std::int64_t seq) {
  const ModelConfig& c = m.config();
  const std::int64_t S = seq > 0 ? seq : c.seq;
  const double tokens = double(c.batch * S);
  return tokens * (6.0 * active_params(m, ep) + 12.0 * double(c.n_layers) * double(c.d_model) * double(S));
}

double measure_peak_flops(int tries) { return cpu_gemm_peak_flops(tries); }

// H100/H200 SXM: the datasheet figures (989.4 TFLOP/s bf16/f16 tensor-core
// dense, 66.9 TFLOP/s f32); other GPUs: SMs x clock x per-SM rate (Hopper:
// 4096 16-bit tensor FLOPs and 256 f32 FLOPs per SM per clock, from the same
// figures).
double cuda_peak_flops(Device device, DType dtype) {
  const DeviceInfo info = device_info(device);
  const bool half = dtype != DType::f32;
  if (info.name.find("H100") != std::string::npos || info.name.find("H200") != std::string::npos)
    return half ? 989.4e12 : 66.9e12;
  return double(info.multiprocessors) * double(info.clock_khz) * 1e3 * (half ? 4096.0 : 256.0);
}

}  // namespace remat::tools
