// Whole models on CUDA: a forward and backward of `tiny` equals the CPU's,
// every recompute plan gives the same bits as `none` on the GPU, bf16 stays
// close to f32, and training on the GPU lowers the loss like the CPU does.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "engine/autograd.h"
#include "models/decoder.h"
#include "models/recompute.h"
#include "ops/ops.h"
#include "train/data.h"
#include "train/trainer.h"

using namespace remat;

namespace {

struct Pass {
  double loss = 0;
  std::map<std::string, std::vector<float>> grads;
};

// One forward + backward of `config` (weights from seed 3, one batch) on `device`.
Pass one_pass(const std::string& config, Device device, DType dtype, const std::string& plan) {
  const ModelConfig c = ModelConfig::named(config);
  manual_seed(5);
  DecoderModel m(c, 3);
  m.set_compute_dtype(dtype);
  apply_recompute_plan(m, RecomputePlan::parse(plan, c.n_layers));
  m.to(device);
  Corpus corpus = generated_corpus(1);
  BatchSampler s(corpus.train, c.batch, c.seq, 2);
  auto out = m.forward_loss(s.next().to(device));
  out.loss.backward();
  Pass p;
  p.loss = out.loss.item();
  for (auto& [name, t] : m.named_parameters()) {
    CHECK(t.device() == device);
    p.grads[name] = t.grad().defined() ? t.grad().to_vector<float>() : std::vector<float>(std::size_t(t.numel()), 0.f);
  }
  return p;
}

// max |a - b| / (atol + rtol |b|) over all elements (<= 1 passes).
double worst_ratio(const std::vector<float>& a, const std::vector<float>& b, double rtol, double atol) {
  double w = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    w = std::max(w, std::fabs(double(a[i]) - double(b[i])) / (atol + rtol * std::fabs(double(b[i]))));
  return w;
}

double norm_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    n += double(b[i]) * double(b[i]);
  }
  return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
}

}  // namespace

TEST_CASE("tiny on CUDA in f32 equals the CPU to 1e-5", "[cuda]") {
  for (const std::string config : {"tiny", "tiny-moe"}) {
    INFO(config);
    const Pass cpu = one_pass(config, kCPU, DType::f32, "none");
    const Pass gpu = one_pass(config, cuda_device(0), DType::f32, "none");
    CHECK(std::fabs(gpu.loss - cpu.loss) <= 1e-5 * std::fabs(cpu.loss));
    for (const auto& [name, g] : cpu.grads) {
      INFO(name);
      // Gradients are sums over the batch: 1e-5 relative plus an absolute
      // floor at 1e-5 of the tensor's largest gradient.
      float mx = 0;
      for (float v : g) mx = std::max(mx, std::fabs(v));
      CHECK(worst_ratio(gpu.grads.at(name), g, 1e-5, 1e-5 * double(mx) + 1e-12) <= 1.0);
    }
  }
}

TEST_CASE("every recompute plan is bit-identical to none on the GPU", "[cuda]") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const std::string config : {"tiny", "tiny-moe"}) {
      const Pass none = one_pass(config, cuda_device(0), dtype, "none");
      std::vector<std::string> plans = {"per_block", "chunk", "selected:0", "uniform:2", "attention",
                                        "selective:save_matmul", "selective:mlp,layernorm", "offload",
                                        "per_block+offload"};
      if (config == "tiny-moe") plans.push_back("moe_expert");
      for (const auto& plan : plans) {
        INFO(config << " " << dtype_name(dtype) << " " << plan);
        const Pass p = one_pass(config, cuda_device(0), dtype, plan);
        CHECK(p.loss == none.loss);
        CHECK(p.grads == none.grads);
      }
      // And a repeat of `none` itself.
      CHECK(one_pass(config, cuda_device(0), dtype, "none").grads == none.grads);
    }
  }
}

TEST_CASE("bf16 on the GPU is close to f32 on the GPU", "[cuda]") {
  const Pass f = one_pass("tiny", cuda_device(0), DType::f32, "none");
  const Pass b = one_pass("tiny", cuda_device(0), DType::bf16, "none");
  CHECK(std::fabs(b.loss - f.loss) <= 1e-2 * f.loss);
  for (const auto& [name, g] : f.grads) {
    INFO(name);
    CHECK(norm_rel(b.grads.at(name), g) <= 0.05);
  }
}

TEST_CASE("training on the GPU lowers the loss like the CPU", "[cuda]") {
  auto train = [](Device device, const std::string& dtype) {
    TrainOptions o;
    o.config = ModelConfig::named("tiny");
    o.steps = 30;
    o.warmup = 5;
    o.eval_every = 0;
    o.eval_batches = 1;
    o.dtype = compute_dtype_from_name(dtype);
    o.device = device;
    Trainer t(o);
    std::vector<double> losses;
    t.run([&](const StepStats& s) { losses.push_back(s.loss); });
    return losses;
  };
  const auto cpu = train(kCPU, "f32");
  const auto gpu = train(cuda_device(0), "f32");
  const auto gpu16 = train(cuda_device(0), "bf16");
  CHECK(gpu.back() < gpu.front() - 1.0);
  CHECK(std::fabs(gpu.back() - cpu.back()) <= 0.01 * cpu.back());
  CHECK(gpu16.back() < gpu16.front() - 1.0);
  CHECK(std::fabs(gpu16.back() - cpu.back()) <= 0.05 * cpu.back());
}
