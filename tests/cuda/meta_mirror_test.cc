// Meta mirroring CUDA (engine/meta_mirror.h, set_meta_kernels): in a build
// with the CUDA back end, and no GPU, meta runs CUDA's op code on shapes.
// Every op case's forward and backward run so and make what the CPU makes
// (shapes, dtypes, meta tensors); a model step holds cuBLASLt's workspace, as
// a GPU step does, where the CPU-mirroring step holds none; bf16 operands are
// not staged to f32. That a step's peak equals a GPU run's byte for byte is
// checked on a GPU (tools/gpu/run.sh: mem --device meta --meta-kernels cuda
// against mem --device cuda). Not tagged [cuda]: it needs no device.
#include <catch2/catch.hpp>

#include "cuda/config.h"
#include "cuda/gemm.h"
#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/device_runtime.h"
#include "engine/meta_mirror.h"
#include "models/decoder.h"
#include "tests/ops/op_cases.h"
#include "tests/skip.h"
#include "train/optimizer.h"

using namespace remat;
using namespace remat::testing;

namespace {

// The case's inputs on `device` (floating ones requiring grad), its output
// and, if it has one, every input gradient after a backward from ones.
std::vector<Tensor> run_case(const OpCase& c, Device device) {
  std::vector<Tensor> in;
  for (const Tensor& t : c.inputs()) {
    Tensor x = t.defined() ? t.detach().to(device) : t;
    if (x.defined() && is_floating(x.dtype()) && c.grad) x.set_requires_grad(true);
    in.push_back(x);
  }
  Tensor y = c.fn(in);
  std::vector<Tensor> out = {y};
  if (!c.grad || !y.requires_grad()) return out;
  y.backward(ones(y.sizes(), TensorOptions(y.dtype(), device)));
  for (const Tensor& x : in) out.push_back(x.defined() && x.requires_grad() ? x.grad() : Tensor());
  return out;
}

// The workspace bytes at the allocator's peak over one bf16 training step of
// a small dense model on meta (AdamW included), and the peak itself.
std::pair<std::int64_t, std::int64_t> step_peak() {
  CachingAllocator& meta = allocator_for(kMeta);
  ModelConfig c = ModelConfig::named("tiny");
  std::unique_ptr<DecoderModel> model;
  {
    DefaultDeviceScope on(kMeta);
    model = std::make_unique<DecoderModel>(c, 0);
  }
  model->set_compute_dtype(DType::bf16);
  AdamW opt(model->named_parameters(), {});
  meta.reset_peak();
  Tensor batch = empty({c.batch, c.seq + 1}, TensorOptions(DType::i64, kMeta));
  model->forward_loss(batch).loss.backward();
  opt.step(1e-3);
  const auto st = meta.stats();
  return {st.category_peak[std::size_t(MemoryCategory::workspace)], st.allocated_peak};
}

}  // namespace

TEST_CASE("meta mirroring CUDA: every op case runs CUDA's code on shapes, as the CPU shapes it") {
  if (!cuda_built()) REMAT_SKIP("no CUDA back end in this build");
  MetaKernelsScope cuda(DeviceType::CUDA);
  for (const OpCase& c : op_cases()) {
    if (!c.cuda) continue;  // (no CUDA path: op_cases.cc says why)
    INFO(c.op << " (" << c.what << ")");
    const std::vector<Tensor> cpu = run_case(c, kCPU);
    std::vector<Tensor> meta;
    REQUIRE_NOTHROW(meta = run_case(c, kMeta));
    REQUIRE(meta.size() == cpu.size());
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      INFO("result " << i);
      REQUIRE(meta[i].defined() == cpu[i].defined());
      if (!cpu[i].defined()) continue;
      CHECK(meta[i].device() == kMeta);
      CHECK(meta[i].sizes() == cpu[i].sizes());
      CHECK(meta[i].dtype() == cpu[i].dtype());
    }
  }
}

TEST_CASE("meta mirroring CUDA: a step holds cuBLASLt's workspace and stages no bf16 operand") {
  if (!cuda_built()) REMAT_SKIP("no CUDA back end in this build");
  const auto [cpu_workspace, cpu_peak] = step_peak();
  std::int64_t cuda_workspace = 0, cuda_peak = 0;
  {
    MetaKernelsScope cuda(DeviceType::CUDA);
    std::tie(cuda_workspace, cuda_peak) = step_peak();
  }
  CHECK(cpu_workspace == 0);
  // (Named only in a discarded statement: a build without the toolkit has no
  // definition behind cuda/gemm.h, cuda/config.h.)
  if constexpr (cuda::kHaveCuda) CHECK(cuda_workspace == std::int64_t(cuda::gemm_workspace_bytes()));
  // The CPU's kernels stage every bf16 operand to f32; CUDA's read bf16: less
  // besides the workspace.
  CHECK(cuda_peak - cuda_workspace < cpu_peak);
}

TEST_CASE("meta mirroring: the setting is checked and scoped") {
  CHECK(meta_kernels() == DeviceType::CPU);
  CHECK_THROWS_WITH(set_meta_kernels(DeviceType::Meta), Catch::Contains("meta mirrors the kernels of cpu or cuda"));
  if (!cuda_built()) {
    CHECK_THROWS_WITH(set_meta_kernels(DeviceType::CUDA), Catch::Contains("this build has no CUDA back end"));
    return;
  }
  {
    MetaKernelsScope cuda(DeviceType::CUDA);
    CHECK(meta_kernels() == DeviceType::CUDA);
    CHECK(runs_cuda_kernels(kMeta));
  }
  CHECK(meta_kernels() == DeviceType::CPU);
  CHECK_FALSE(runs_cuda_kernels(kMeta));
  CHECK(runs_cuda_kernels(Device(DeviceType::CUDA, 0)));
}
