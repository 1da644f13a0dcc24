#include "tools/bench_estimate.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>

#include "checkpoint/checkpoint.h"
#include "checkpoint/plan.h"
#include "checkpoint/time_estimate.h"
#include "engine/autograd.h"
#include "engine/device_runtime.h"
#include "engine/op_hooks.h"
#include "models/decoder.h"
#include "models/recompute.h"
#include "tools/bench_worker.h"
#include "tools/json.h"
#include "train/data.h"

namespace remat::tools {

namespace {

// One traced training step of `c` under `plan`: the peak of the activation
// bytes the ops save (saved-tensor registry, persistent state excluded), and
// the peak of all non-persistent bytes (those plus backward's working set of
// gradients and temporaries), from the allocator.
struct Trace {
  double saved = 0;
  double total = 0;
};

Trace trace_step(const ModelConfig& c, const std::string& plan, Device device = kCPU,
                 StepTimeEstimator* estimator = nullptr) {
  std::unique_ptr<DecoderModel> built;
  {
    DefaultDeviceScope on(device);  // meta: parameters and gradients take no memory
    built = std::make_unique<DecoderModel>(c, 0);
  }
  DecoderModel& model = *built;
  apply_recompute_plan(model, RecomputePlan::parse(plan, c.n_layers));
  Tensor batch;
  if (device.is_meta()) {
    batch = empty({c.batch, c.seq + 1}, TensorOptions(DType::i64, device));
  } else {
    Corpus corpus = generated_corpus(0, std::int64_t(1) << 16, c.seq + 2);
    batch = BatchSampler(corpus.train, c.batch, c.seq, 1).next();
  }
  auto& alloc = allocator_for(device);
  // Gradient buffers exist from the first step on: allocate them first.
  for (auto& [name, p] : model.named_parameters()) {
    CategoryScope cat(MemoryCategory::gradient);
    p.set_grad(zeros(p.sizes(), TensorOptions(DType::f32, device)));
  }
  const std::int64_t base_saved = saved_bytes_report().activation_live_bytes;
  const std::int64_t base_alloc = alloc.stats().allocated_bytes;
  reset_saved_bytes_peak();
  alloc.reset_peak();
  {
    CategoryScope cat(MemoryCategory::activation);
    std::optional<OpHookScope> timed;
    if (estimator) timed.emplace(std::shared_ptr<OpHook>(estimator, [](OpHook*) {}));
    Tensor loss = model.forward_loss(batch).loss;
    loss.backward();
  }
  Trace t;
  t.saved = double(saved_bytes_report().activation_peak_bytes - base_saved);
  t.total = double(alloc.stats().allocated_peak - base_alloc);
  return t;
}

// The saves of one block and of the rest of the model (embedding, head and
// loss), from 1- and 2-block traces at batch 1, scaled to the batch.
struct SaveSplit {
  double block = 0, rest = 0;
};

SaveSplit block_and_rest(const ModelConfig& one, double batch, Device device) {
  ModelConfig l1 = one, l2 = one;
  l1.n_layers = 1;
  l2.n_layers = 2;
  l1.dense_first = l2.dense_first = 0;  // MoE configs: the per-block figure is an MoE block's
  const double p1 = trace_step(l1, "none", device).saved, p2 = trace_step(l2, "none", device).saved;
  return {(p2 - p1) * batch, (p1 - (p2 - p1)) * batch};
}

}  // namespace

int run_estimate(const BenchOptions& o) {
  const ModelConfig& c = o.model;
  ModelConfig one = c;
  one.batch = 1;
  const double B = double(c.batch);
  const double input_bytes = double(c.batch * c.seq * c.d_model * 4);
  const SaveSplit split = block_and_rest(one, B, o.device);
  std::printf("activation estimate for %s (traced at batch 1, scaled to batch %lld):\n", c.name.c_str(),
              static_cast<long long>(c.batch));
  std::printf("  per block: saved tensors %.2f MiB, block input (a region boundary) %.2f MiB; embedding + head + loss %.2f MiB\n\n",
              split.block / 1048576.0, input_bytes / 1048576.0, split.rest / 1048576.0);
  const bool meta = o.device.is_meta();
  std::printf("%-24s %12s %14s %14s %8s%s\n", "plan", "saved MiB", "predicted MiB",
              meta ? "meta MiB" : "measured MiB", "error", meta ? "  estimated step ms" : "");
  std::vector<JsonObject> rows;
  for (const auto& plan : o.plans) {
    const Trace t = trace_step(one, plan, o.device);
    const double predicted = t.total * B;
    double measured = 0, estimated_ms = 0;
    if (meta) {  // the full batch's step on meta: the allocator's exact figure, and the time estimate
      StepTimeEstimator estimator(device_model(o.device_model));
      measured = trace_step(c, plan, o.device, &estimator).total;
      estimated_ms = estimator.estimate().total() * 1e3;
    } else {
      measured = run_worker(o.config, plan, 1, 1, o.threads, std::to_string(o.seed)).at("activation_bytes");
    }
    const double err = measured > 0 ? (predicted - measured) / measured : 0.0;
    std::printf("%-24s %12.2f %14.2f %14.2f %7.1f%%", plan.c_str(), t.saved * B / 1048576.0, predicted / 1048576.0,
                measured / 1048576.0, 100 * err);
    if (meta) std::printf("  %.1f (%s, an estimate)", estimated_ms, o.device_model.c_str());
    std::printf("\n");
    JsonObject j;
    j.set("plan", plan).set("config", c.name).set("predicted_activation_bytes", predicted);
    j.set("predicted_saved_bytes", t.saved * B);
    j.set("activation_bytes", measured).set("relative_error", err).set("device", o.device.str());
    if (meta) j.set("estimated_step_ms", estimated_ms).set("device_model", o.device_model);
    j.set("block_saved_bytes", split.block).set("block_input_bytes", input_bytes).set("rest_saved_bytes", split.rest);
    rows.push_back(j);
  }
  std::printf(meta ? "(meta: the full batch's forward and backward on shapes alone, peak allocated minus parameters and "
                     "gradients, exactly the CPU's; step time estimated, without the optimizer)\n"
                   : "(measured: peak allocated minus parameters, gradients and optimizer state, one step in a fresh "
                     "process)\n");
  if (o.json_path && !o.json_path->empty()) {
    std::ofstream out(*o.json_path);
    REMAT_CHECK(out.good(), IOError, "bench: cannot write ", *o.json_path);
    out << json_array(rows);
    std::printf("wrote %s\n", o.json_path->c_str());
  }
  return 0;
}

}  // namespace remat::tools
