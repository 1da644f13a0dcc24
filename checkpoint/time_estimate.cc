#include "checkpoint/time_estimate.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>

#include "checkpoint/checkpoint.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/op_def.h"
#include "engine/recompute_context.h"
#include "ops/matmul.h"

namespace remat {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The best of a few 64 MiB copies (well past the caches), in bytes moved
// (read + written) per second.
double measured_memory_bw() {
  const std::size_t n = std::size_t(64) << 20;
  std::vector<char> src(n, 1), dst(n, 0);
  double best = 0;
  for (int i = 0; i < 8; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), n);
    best = std::max(best, 2.0 * double(n) / seconds_since(t0));
  }
  return best;
}

// Published figures (dense, no sparsity). H100 / H200 SXM: NVIDIA's
// datasheets, 989.4 TFLOP/s bf16, 66.9 TFLOP/s f32, HBM3 3.35 TB/s and HBM3e
// 4.8 TB/s, NVLink 4 900 GB/s (450 each way). B200 (HGX, 1000 W): 2.25
// PFLOP/s bf16, 80 TFLOP/s f32, HBM3e 8 TB/s, NVLink 5 1.8 TB/s (900 each
// way) (NVIDIA's Blackwell figures as collected at
// glennklockwood.com/garden/processors/B200). The host link: PCIe Gen5 x16,
// 64 GB/s each way (Hopper); Gen6 x16, 128 GB/s (Blackwell). f32 products
// are counted at the f32 (non-tensor-core) rate, as remat's f32 GEMMs do not
// use TF32. A kernel launch and its dispatch: 5 us. Between nodes (DGX
// H100 / H200 / B200): one 400 Gb/s ConnectX-7 port per GPU, 50 GB/s each
// way; eight GPUs a node; 10 us fixed per collective (NCCL's small-message
// latency is of that order).
const DeviceModel kH100{"h100", 989.4e12, 66.9e12, 66.9e12, 3.35e12, 450e9, 64e9, 5e-6, "NVIDIA H100 SXM datasheet",
                        8, 50e9, 10e-6};
const DeviceModel kH200{"h200", 989.4e12, 66.9e12, 66.9e12, 4.8e12, 450e9, 64e9, 5e-6, "NVIDIA H200 SXM datasheet",
                        8, 50e9, 10e-6};
const DeviceModel kB200{"b200", 2.25e15, 80e12, 80e12, 8.0e12, 900e9, 128e9, 5e-6, "NVIDIA HGX B200 (1000 W) figures",
                        8, 50e9, 10e-6};

}  // namespace

std::vector<std::string> device_model_names() { return {"h100", "h200", "b200", "cpu-measured"}; }

void check_device_model(const std::string& name) {
  const auto known = device_model_names();
  if (std::find(known.begin(), known.end(), name) == known.end()) (void)device_model(name);  // throws, listing them
}

DeviceModel device_model(const std::string& name) {
  if (name == "h100") return kH100;
  if (name == "h200") return kH200;
  if (name == "b200") return kB200;
  if (name == "cpu-measured") {
    // Measured once per process: the CPU computes 16-bit products in f32, so
    // one GEMM peak serves both, and (memory-bound) vector work too. An op
    // call's dispatch on the CPU: 2 us (thread wake-up, staging).
    static std::once_flag once;
    static DeviceModel m;
    std::call_once(once, [] {
      // Offload's spill file sits in the page cache: host "transfers" at memory speed.
      const double gemm = cpu_gemm_peak_flops(12), bw = measured_memory_bw();
      // Ranks of one machine talk through shared memory: memcpy speed, one node.
      m = DeviceModel{"cpu-measured", gemm, gemm, gemm, bw, bw, bw, 2e-6,
                      "this machine: best 1024^3 f32 GEMM, best 64 MiB memcpy", 1 << 30, bw, 5e-6};
    });
    return m;
  }
  std::string known;
  for (const auto& n : device_model_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("unknown device model '" + name + "'; known: " + known);
}

std::optional<std::vector<Tensor>> StepTimeEstimator::before(const OpCall& call) {
  open_.emplace_back(&call, checkpoint_counters().ops_skipped);
  return std::nullopt;
}

void StepTimeEstimator::after(const OpCall& call, const std::vector<Tensor>& outputs) {
  std::int64_t skipped_before = -1;
  for (std::size_t i = open_.size(); i-- > 0;)
    if (open_[i].first == &call) {
      skipped_before = open_[i].second;
      open_.resize(i);
      break;
    }
  if (!call.op) return;  // custom ops, and the calls backward makes of its own
  const bool replay = in_recompute();
  if (replay && skipped_before >= 0 && checkpoint_counters().ops_skipped > skipped_before) {
    est_.replay += model_.op_seconds;  // the kernel did not run: a policy handed back its outputs
    return;
  }
  if (!replay && backward_mode() != BackwardMode::none) return;  // counted with the forward call
  const OpCost c = call.op->cost(call);
  if (c.matmul_flops == 0 && c.vector_flops == 0 && c.bytes == 0) return;  // an op that runs others
  const bool half = !call.inputs.empty() && call.inputs[0].defined() &&
                    (call.inputs[0].dtype() == DType::bf16 || call.inputs[0].dtype() == DType::f16);
  const double compute =
      c.matmul_flops / (half ? model_.matmul16_flops : model_.matmul32_flops) + c.vector_flops / model_.vector_flops;
  const double t = std::max(compute, c.bytes / model_.memory_bw) + model_.op_seconds;
  if (replay) {
    est_.replay += t;
    return;
  }
  est_.forward += t;
  const bool records = std::any_of(outputs.begin(), outputs.end(), [](const Tensor& o) {
    return o.defined() && o.requires_grad();
  });
  if (records) est_.backward += 2 * t;
}

void StepTimeEstimator::add_transfer(std::int64_t bytes) {
  if (bytes > 0) est_.offload += double(bytes) / model_.host_bw;
}

void StepTimeEstimator::add_optimizer(std::int64_t params) {
  const double n = double(params);
  est_.optimizer += std::max(12 * n / model_.vector_flops, 28 * n / model_.memory_bw) + model_.op_seconds;
}

}  // namespace remat
