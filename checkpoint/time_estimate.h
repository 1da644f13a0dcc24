// A step's time, estimated from the op table's costs (engine/op_def.h
// OpCost) on a named device model, for devices this machine does not have
// and for steps run on the meta device. It is an estimate, labelled so
// wherever it is printed: a roofline per op call plus a fixed cost per call.
//
// Per op call with a cost: t = max(matmul_flops / matmul peak + vector_flops
// / vector peak, bytes / memory bandwidth) + overhead, the matmul peak the
// 16-bit one when the call's first input is bf16 or f16. Forward calls that
// record autograd add 2 t for their backward (dgrad and wgrad for products;
// the same ratio for the rest; the op calls backward itself makes are not
// counted again); calls inside a checkpoint replay add t, or only the fixed
// cost when a save policy handed back their cached outputs; AdamW adds its
// bytes (4 f32 tensors read, 3 written, per parameter) over the bandwidth;
// offload adds the bytes it moved over the host link, not overlapped (an
// upper bound: a real run hides some behind compute).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/op_hooks.h"

namespace remat {

// A device for the estimate.
struct DeviceModel {
  std::string name;
  double matmul16_flops = 0;  // dense bf16/f16 matrix peak, FLOP/s
  double matmul32_flops = 0;  // dense f32 matrix peak, FLOP/s
  double vector_flops = 0;    // f32 peak outside matrix units, FLOP/s
  double memory_bw = 0;       // device memory, bytes/s
  double link_bw = 0;         // to another device, bytes/s each way
  double host_bw = 0;         // to host memory (offload), bytes/s each way
  double op_seconds = 0;      // fixed cost per op call (launch, dispatch)
  std::string source;         // where the figures come from
  // The link model (train/comm_estimate.h): devices per node, joined by
  // link_bw; between nodes network_bw per device each way; a fixed cost per
  // collective, send or receive.
  int devices_per_node = 8;
  double network_bw = 0;
  double comm_seconds = 0;
};

// "h100", "h200", "b200" (published dense peaks and bandwidths), or
// "cpu-measured" (this machine's GEMM peak and memory bandwidth, measured
// on first use, about a second). Throws Error naming `name` and listing the
// known ones.
DeviceModel device_model(const std::string& name);
std::vector<std::string> device_model_names();
// Throws device_model's Error unless `name` is a known model (measures nothing).
void check_device_model(const std::string& name);

// What the estimate adds up to, in seconds.
struct StepEstimate {
  double forward = 0, backward = 0, replay = 0, optimizer = 0, offload = 0;
  double comm = 0;  // collectives, sends and receives, not overlapped (train/comm_estimate.h)
  double total() const { return forward + backward + replay + optimizer + offload + comm; }
};

// An op hook that adds up a step's estimate while the step runs (install
// it with OpHookScope; it observes and changes nothing).
class StepTimeEstimator final : public OpHook {
 public:
  explicit StepTimeEstimator(DeviceModel model) : model_(std::move(model)) {}
  std::optional<std::vector<Tensor>> before(const OpCall& call) override;
  void after(const OpCall& call, const std::vector<Tensor>& outputs) override;
  // AdamW over `params` f32 parameters.
  void add_optimizer(std::int64_t params);
  // `bytes` moved between the device and the host (offload's writes and reads).
  void add_transfer(std::int64_t bytes);
  // Communication estimated elsewhere (train/comm_estimate.h).
  void add_comm(double seconds) { est_.comm += seconds; }
  const StepEstimate& estimate() const { return est_; }
  void reset() { est_ = {}; }
  const DeviceModel& model() const { return model_; }

 private:
  DeviceModel model_;
  StepEstimate est_;
  // Open calls and the replay kernels skipped before each began (a call
  // whose count grew took cached outputs); a call an exception cut short
  // is dropped with the next one that closes below it.
  std::vector<std::pair<const OpCall*, std::int64_t>> open_;
};

}  // namespace remat
