#include "tools/bench_estimate.h"

#include <cstdio>
#include <fstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/plan.h"
#include "engine/autograd.h"
#include "engine/device_runtime.h"
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

Trace trace_step(const ModelConfig& c, const std::string& plan) {
  DecoderModel model(c, 0);
  apply_recompute_plan(model, RecomputePlan::parse(plan, c.n_layers));
  Corpus corpus = generated_corpus(0, std::int64_t(1) << 16, c.seq + 2);
  BatchSampler sampler(corpus.train, c.batch, c.seq, 1);
  auto& alloc = allocator_for(kCPU);
  // Gradient buffers exist from the first step on: allocate them first.
  for (auto& [name, p] : model.named_parameters()) {
    CategoryScope cat(MemoryCategory::gradient);
    p.set_grad(zeros(p.sizes()));
  }
  const std::int64_t base_saved = saved_bytes_report().activation_live_bytes;
  const std::int64_t base_alloc = alloc.stats().allocated_bytes;
  reset_saved_bytes_peak();
  alloc.reset_peak();
  {
    CategoryScope cat(MemoryCategory::activation);
    Tensor loss = model.forward_loss(sampler.next()).loss;
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

SaveSplit block_and_rest(const ModelConfig& one, double batch) {
  ModelConfig l1 = one, l2 = one;
  l1.n_layers = 1;
  l2.n_layers = 2;
  l1.dense_first = l2.dense_first = 0;  // MoE configs: the per-block figure is an MoE block's
  const double p1 = trace_step(l1, "none").saved, p2 = trace_step(l2, "none").saved;
  return {(p2 - p1) * batch, (p1 - (p2 - p1)) * batch};
}

}  // namespace

int run_estimate(const BenchOptions& o) {
  const ModelConfig& c = o.model;
  ModelConfig one = c;
  one.batch = 1;
  const double B = double(c.batch);
  const double input_bytes = double(c.batch * c.seq * c.d_model * 4);
  const SaveSplit split = block_and_rest(one, B);
  std::printf("activation estimate for %s (traced at batch 1, scaled to batch %lld):\n", c.name.c_str(),
              static_cast<long long>(c.batch));
  std::printf("  per block: saved tensors %.2f MiB, block input (a region boundary) %.2f MiB; embedding + head + loss %.2f MiB\n\n",
              split.block / 1048576.0, input_bytes / 1048576.0, split.rest / 1048576.0);
  std::printf("%-24s %12s %14s %14s %8s\n", "plan", "saved MiB", "predicted MiB", "measured MiB", "error");
  std::vector<JsonObject> rows;
  for (const auto& plan : o.plans) {
    const Trace t = trace_step(one, plan);
    const double predicted = t.total * B;
    const auto m = run_worker(o.config, plan, 1, 1, o.threads, std::to_string(o.seed));
    const double measured = m.at("activation_bytes");
    const double err = measured > 0 ? (predicted - measured) / measured : 0.0;
    std::printf("%-24s %12.2f %14.2f %14.2f %7.1f%%\n", plan.c_str(), t.saved * B / 1048576.0, predicted / 1048576.0,
                measured / 1048576.0, 100 * err);
    JsonObject j;
    j.set("plan", plan).set("config", c.name).set("predicted_activation_bytes", predicted);
    j.set("predicted_saved_bytes", t.saved * B);
    j.set("activation_bytes", measured).set("relative_error", err);
    j.set("block_saved_bytes", split.block).set("block_input_bytes", input_bytes).set("rest_saved_bytes", split.rest);
    rows.push_back(j);
  }
  std::printf("(measured: peak allocated minus parameters, gradients and optimizer state, one step in a fresh process)\n");
  if (o.json_path && !o.json_path->empty()) {
    std::ofstream out(*o.json_path);
    REMAT_CHECK(out.good(), IOError, "bench: cannot write ", *o.json_path);
    out << json_array(rows);
    std::printf("wrote %s\n", o.json_path->c_str());
  }
  return 0;
}

}  // namespace remat::tools
