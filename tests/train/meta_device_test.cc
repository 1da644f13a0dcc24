// The meta device (docs/META.md): tensors with shapes and storage sizes but
// no memory; ops run their checks and the CPU's allocations; a model and its
// optimizer built there cost no host memory; every read of values is a clear
// error naming what was asked. (The event-for-event equality with the CPU
// over whole training steps is tests/tools/meta_mem_test.sh.)
#include <catch2/catch.hpp>

#include <sstream>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "models/decoder.h"
#include "ops/kernel_table.h"
#include "ops/ops.h"
#include "train/optimizer.h"
#include "train/safetensors.h"

using namespace remat;

namespace {

// The message of the DeviceError `fn` throws (fails the test if none).
template <typename Fn>
std::string device_error(Fn&& fn) {
  try {
    fn();
  } catch (const DeviceError& e) {
    return e.what();
  }
  FAIL("no DeviceError");
  return "";
}

}  // namespace

TEST_CASE("meta: the device parses, prints and compares") {
  CHECK(Device::parse("meta") == kMeta);
  CHECK(kMeta.str() == "meta");
  CHECK(kMeta.is_meta());
  CHECK_FALSE(kMeta.is_cpu());
  CHECK_THROWS_WITH(Device::parse("metal"), Catch::Contains("expected cpu, cuda, cuda:N or meta"));
}

TEST_CASE("meta: tensors take meta's allocator and no host memory") {
  CachingAllocator& cpu = allocator_for(kCPU);
  CachingAllocator& meta = allocator_for(kMeta);
  CHECK(meta.device() == kMeta);
  const std::int64_t cpu_before = cpu.stats().allocated_bytes, meta_before = meta.stats().allocated_bytes;
  {
    // 64 GiB: a real allocation of that much would fail on this machine.
    Tensor big = empty({std::int64_t(1) << 34}, TensorOptions(DType::f32, kMeta));
    CHECK(big.device() == kMeta);
    CHECK(big.nbytes() == std::size_t(1) << 36);
    CHECK(meta.stats().allocated_bytes - meta_before == std::int64_t(1) << 36);
    Tensor z = zeros({3, 4}, TensorOptions(DType::bf16, kMeta));  // a fill is a no-op
    CHECK(z.sizes() == Shape{3, 4});
    CHECK(cpu.stats().allocated_bytes == cpu_before);
  }
  CHECK(meta.stats().allocated_bytes == meta_before);
}

TEST_CASE("meta: Tensor::to(meta) keeps the shape and drops the values") {
  Tensor c = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor m = c.to(kMeta);
  CHECK(m.device() == kMeta);
  CHECK(m.sizes() == c.sizes());
  CHECK(m.dtype() == DType::f32);
  Tensor h = m.to(DType::bf16).t().contiguous();
  CHECK(h.sizes() == Shape{3, 2});
  CHECK(h.dtype() == DType::bf16);
  CHECK(h.is_contiguous());
}

TEST_CASE("meta: every read of values is a clear error") {
  Tensor m = empty({2, 3}, TensorOptions(DType::f32, kMeta));
  CHECK_THAT(device_error([&] { (void)m.data<float>(); }),
             Catch::Contains("data access: a meta tensor (f32 [2, 3]) has a shape but no values"));
  CHECK_THAT(device_error([&] { (void)sum(m).item(); }), Catch::Contains("has a shape but no values"));
  CHECK_THAT(device_error([&] { (void)m.at({0, 0}); }), Catch::StartsWith("at: a meta tensor"));
  CHECK_THAT(device_error([&] { m.set({0, 0}, 1.0); }), Catch::StartsWith("set: a meta tensor"));
  CHECK_THAT(device_error([&] { (void)m.to_vector<float>(); }), Catch::Contains("copy to another device"));
  CHECK_THAT(device_error([&] { (void)m.to(kCPU); }), Catch::Contains("copy to another device"));
  std::ostringstream os;
  CHECK_THAT(device_error([&] { os << m; }), Catch::Contains("printing values"));
  CHECK_THAT(device_error([&] {
               save_safetensors("/nonexistent-dir/meta.safetensors", {{"w", m}});
             }),
             Catch::Contains("has a shape but no values"));
}

TEST_CASE("meta: ops check and shape as on the CPU, and compute nothing") {
  Tensor a = empty({4, 8}, TensorOptions(DType::f32, kMeta));
  a.set_requires_grad(true);
  Tensor w = empty({16, 8}, TensorOptions(DType::f32, kMeta));
  w.set_requires_grad(true);
  Tensor y = swiglu(matmul(a, w.t()), matmul(a, w.t()));
  CHECK(y.sizes() == Shape{4, 16});
  CHECK(y.device() == kMeta);
  sum(y).backward();  // autograd records and runs on shapes
  REQUIRE(a.grad().defined());
  CHECK(a.grad().sizes() == a.sizes());
  CHECK(a.grad().device() == kMeta);
  CHECK(w.grad().sizes() == w.sizes());
  // Shape errors are the CPU's.
  CHECK_THROWS_WITH(matmul(a, w), Catch::Contains("matmul"));
  // Meta runs the CPU's kernels: a meta registration is refused.
  CHECK_THROWS_WITH(matmul_kernels().add(DeviceType::Meta, {}, KernelDTypes::f32),
                    Catch::Contains("meta runs the CPU's kernels"));
  CHECK(matmul_kernels().has(DeviceType::Meta));
}

TEST_CASE("meta: a model and its optimizer built on meta cost no host memory") {
  CachingAllocator& cpu = allocator_for(kCPU);
  const std::int64_t cpu_before = cpu.stats().allocated_bytes;
  const std::int64_t meta_before = allocator_for(kMeta).stats().allocated_bytes;
  ModelConfig c = ModelConfig::named("llama3-8b");
  c.n_layers = 2;  // the shape of two of its blocks; the whole model works too, just slower to build
  std::unique_ptr<DecoderModel> model;
  {
    DefaultDeviceScope on(kMeta);
    model = std::make_unique<DecoderModel>(c, 0);
  }
  std::int64_t param_bytes = 0;
  for (const auto& [name, p] : model->named_parameters()) {
    CHECK(p.device() == kMeta);
    param_bytes += std::int64_t(p.nbytes());
  }
  CHECK(param_bytes > std::int64_t(2) << 30);  // 2 GiB of embedding and head alone
  AdamW opt(model->named_parameters(), {});
  CHECK(allocator_for(kMeta).stats().allocated_bytes - meta_before >= 3 * param_bytes);
  CHECK(cpu.stats().allocated_bytes == cpu_before);
  // One step on shapes: the batch, the loss, backward and the update.
  c.seq = 64;
  Tensor batch = empty({1, c.seq + 1}, TensorOptions(DType::i64, kMeta));
  DecoderModel::Output out = model->forward_loss(batch);
  CHECK(out.loss.device() == kMeta);
  CHECK(out.loss.dim() == 0);
  out.loss.backward();
  CHECK(clip_grad_norm(model->parameters(), 1.0) == 0.0);  // no values: a norm of 0, nothing clipped
  opt.step(1e-3);
  CHECK(cpu.stats().allocated_bytes == cpu_before);
  CHECK_THAT(device_error([&] { (void)out.loss.item(); }), Catch::Contains("has a shape but no values"));
}
