// Offload and compression of saved tensors (checkpoint/offload.h,
// checkpoint/compress.h): alone, stacked with each other and with checkpoint
// regions; exactness, bounds, the version check, failures.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <optional>

#include "checkpoint/checkpoint.h"
#include "checkpoint/compress.h"
#include "checkpoint/offload.h"
#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/rng.h"
#include "ops/ops.h"
#include "tests/tensor_compare.h"

using namespace remat;
using remat::test::same_bits;

namespace {

Tensor param(const Shape& s, std::uint64_t seed, double scale) {
  CategoryScope cat(MemoryCategory::parameter);  // as a model's weights: never compressed
  Generator g(seed);
  Tensor t = mul(randn(s, DType::f32, &g), scale);
  t.set_requires_grad(true);
  return t;
}

// A three-layer MLP with a checkpoint region around its middle layer when
// asked; `hooks` are active around the whole forward.
struct Net {
  Tensor x, w1, w2, w3;
  Net() {
    Generator g(7);
    x = randn({64, 128}, DType::f32, &g);
    w1 = param({128, 128}, 1, 0.1);
    w2 = param({128, 128}, 2, 0.1);
    w3 = param({128, 128}, 3, 0.1);
  }
  Tensor forward(bool region) const {
    Tensor h = gelu(matmul(x, w1));
    auto mid = [this](const Tensor& t) { return tanh(matmul(t, w2)); };
    h = region ? checkpoint(mid, h) : mid(h);
    h = gelu(matmul(h, w3));
    return mean(mul(h, h));
  }
  std::vector<Tensor> grads(bool region, const std::vector<std::shared_ptr<SavedTensorHooks>>& hooks,
                            OffloadHooks* flush_me = nullptr) {
    for (Tensor* w : {&w1, &w2, &w3}) w->set_grad(Tensor());
    Tensor loss;
    {
      std::vector<std::unique_ptr<SavedTensorHooksScope>> scopes;
      for (const auto& h : hooks) scopes.push_back(std::make_unique<SavedTensorHooksScope>(h));  // first = outermost
      CategoryScope cat(MemoryCategory::activation);
      loss = forward(region);
    }
    if (flush_me) flush_me->flush();
    loss.backward();
    return {w1.grad().clone(), w2.grad().clone(), w3.grad().clone(), loss.detach()};
  }
};

// max |a - b| / max |a| over the three gradients.
double rel_error(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < 3; ++i) {
    const auto x = a[i].to_vector<float>(), y = b[i].to_vector<float>();
    for (std::size_t k = 0; k < x.size(); ++k) {
      err = std::max(err, double(std::abs(x[k] - y[k])));
      norm = std::max(norm, double(std::abs(x[k])));
    }
  }
  return err / norm;
}

OffloadOptions small_offload() {
  OffloadOptions o;
  o.min_bytes = 1024;
  return o;
}

}  // namespace

TEST_CASE("offload is exact, alone and around a checkpoint region", "[offload]") {
  Net net;
  for (bool region : {false, true}) {
    INFO("region " << region);
    const auto plain = net.grads(region, {});
    auto off = std::make_shared<OffloadHooks>(small_offload());
    const auto offloaded = net.grads(region, {off}, off.get());
    CHECK(same_bits(plain, offloaded));
    const OffloadStats s = off->stats();
    CHECK(s.saves >= (region ? 5 : 6));  // around a region: its boundary input too
    CHECK(s.bytes_written > 0);
    CHECK(s.bytes_read + s.memory_hits > 0);
    CHECK(s.failed_writes == 0);
    CHECK(s.stored_bytes == 0);  // everything released after backward
  }
}

TEST_CASE("offload frees the activation memory it moved and prefetches in tape order", "[offload]") {
  Net net;
  auto& alloc = allocator_for(kCPU);
  auto held_after_forward = [&](std::shared_ptr<OffloadHooks> off, Tensor& loss) {
    std::optional<SavedTensorHooksScope> scope;
    if (off) scope.emplace(off);
    CategoryScope cat(MemoryCategory::activation);
    const std::int64_t before = alloc.stats().category(MemoryCategory::activation);
    loss = net.forward(false);
    if (off) off->flush();
    return alloc.stats().category(MemoryCategory::activation) - before;
  };
  Tensor plain_loss, loss;
  const std::int64_t plain = held_after_forward(nullptr, plain_loss);
  plain_loss = Tensor();
  auto off = std::make_shared<OffloadHooks>(small_offload());
  const std::int64_t offloaded = held_after_forward(off, loss);
  const OffloadStats s = off->stats();
  INFO("activation bytes held after the forward: " << plain << " plain, " << offloaded << " offloaded; written "
                                                   << s.bytes_written);
  // x, gelu's input, the two hidden states, tanh's output, gelu's input: each
  // once (mul(h, h) saves h twice), the weights not at all.
  CHECK(s.bytes_written == 6 * 64 * 128 * 4);
  CHECK(offloaded < plain / 20);  // the memory went (the loss's small saves stay)
  CHECK(s.stored_peak == s.bytes_written);
  // The written bytes left the page cache too (where the file system honours
  // the advice: the spill folder's); a file of zero cached bytes at least
  // reads as such.
  const std::int64_t cached = off->page_cache_bytes();
  INFO("spill file bytes in the page cache after the forward: " << cached);
  CHECK(cached <= s.bytes_written / 8);
  loss.backward();
  CHECK(off->page_cache_bytes() <= s.bytes_written / 8);  // read back, dropped again
  const OffloadStats b = off->stats();
  CHECK(b.sync_reads >= 1);       // the first unpack finds nothing started
  CHECK(b.prefetch_hits >= 3);    // the rest were read ahead
  CHECK(b.bytes_read >= b.bytes_written);  // each once, or more for a view two ops saved
}

TEST_CASE("a small view that would keep a large storage alive is offloaded too", "[offload]") {
  // An MoE expert saves its few rows of the dispatch payload: kept, that view
  // kept the whole payload. Offload takes it (and so frees the payload)
  // though it is under min_bytes; a small save with its own storage stays.
  auto& alloc = allocator_for(kCPU);
  Tensor w = param({128, 128}, 4, 0.1);
  auto payload = [] {  // 128 KiB
    Generator g(9);
    return randn({256, 128}, DType::f32, &g);
  };
  OffloadOptions o;  // min_bytes 64 KiB: the 8-row view (4 KiB) is far under it
  auto off = std::make_shared<OffloadHooks>(o);
  Tensor loss;
  std::int64_t held = 0;
  {
    SavedTensorHooksScope scope(off);
    CategoryScope cat(MemoryCategory::activation);
    const std::int64_t before = alloc.stats().category(MemoryCategory::activation);
    {
      Tensor p = payload();
      loss = sum(matmul(p.narrow(0, 8, 8), w));  // saves the view (and w, which stays)
    }
    off->flush();
    held = alloc.stats().category(MemoryCategory::activation) - before;
  }
  const OffloadStats s = off->stats();
  CHECK(s.saves == 1);
  CHECK(s.bytes_written == 8 * 128 * 4);  // the view's bytes, not its storage's
  CHECK(s.bytes_taken == s.bytes_written);
  CHECK(held < 64 * 1024);                // the 128 KiB payload went
  loss.backward();
  const Tensor g1 = w.grad().clone();     // equal to a run without offload, bit for bit
  w.set_grad(Tensor());
  sum(matmul(payload().narrow(0, 8, 8), w)).backward();
  CHECK(same_bits({g1}, {w.grad()}));
  // A small save with its own storage stays.
  auto off2 = std::make_shared<OffloadHooks>(o);
  {
    SavedTensorHooksScope scope(off2);
    CategoryScope cat(MemoryCategory::activation);
    Tensor own = payload().narrow(0, 0, 8).clone();  // 4 KiB storage of its own
    loss = sum(matmul(own, w));
  }
  CHECK(off2->stats().saves == 0);
}

TEST_CASE("an in-place write to an offloaded or compressed tensor is still caught", "[offload][compress]") {
  for (int kind = 0; kind < 2; ++kind) {
    INFO((kind == 0 ? "offload" : "compress"));
    Tensor w = param({128, 128}, 4, 0.1);
    Generator g(5);
    Tensor x = randn({64, 128}, DType::f32, &g);
    std::shared_ptr<SavedTensorHooks> hooks;
    if (kind == 0)
      hooks = std::make_shared<OffloadHooks>(small_offload());
    else
      hooks = std::make_shared<CompressHooks>(CompressOptions{});
    Tensor y;
    {
      SavedTensorHooksScope scope(hooks);
      y = matmul(x, w);  // saves x (offloaded or compressed)
    }
    x.fill_(1.0);
    CHECK_THROWS_WITH(sum(y).backward(), Catch::Contains("saved by op 'matmul'") &&
                                             Catch::Contains("was modified in place afterwards"));
  }
}

TEST_CASE("a failing offload write raises a clear error and loses nothing", "[offload]") {
  Net net;
  const auto plain = net.grads(false, {});
  OffloadOptions o = small_offload();
  o.capacity_bytes = 64 * 128 * 4 + 10;  // room for the first save only
  auto off = std::make_shared<OffloadHooks>(o);
  for (Tensor* w : {&net.w1, &net.w2, &net.w3}) w->set_grad(Tensor());
  Tensor loss;
  {
    SavedTensorHooksScope scope(off);
    loss = net.forward(false);
  }
  CHECK_THROWS_WITH(off->flush(), Catch::Contains("offload: writing save #") &&
                                    Catch::Contains("No space left on device") &&
                                    Catch::Contains("the tensor stayed in memory, nothing is lost"));
  CHECK(off->stats().failed_writes >= 1);  // (those queued before the first failure fail too)
  CHECK(off->stats().bytes_written == 64 * 128 * 4);
  CHECK_NOTHROW(off->flush());  // reported once
  loss.backward();
  const std::vector<Tensor> got{net.w1.grad(), net.w2.grad(), net.w3.grad(), loss.detach()};
  CHECK(same_bits(plain, got));
}

TEST_CASE("synchronous offload writes at pack and reads at prefetch, on the calling thread", "[offload]") {
  Net net;
  const auto plain = net.grads(false, {});
  OffloadOptions o = small_offload();
  o.synchronous = true;
  auto off = std::make_shared<OffloadHooks>(o);
  for (Tensor* w : {&net.w1, &net.w2, &net.w3}) w->set_grad(Tensor());
  Tensor loss;
  {
    SavedTensorHooksScope scope(off);
    CategoryScope cat(MemoryCategory::activation);
    loss = net.forward(false);
  }
  // Without a flush: every save is on file the moment it was packed.
  CHECK(off->stats().bytes_written == 6 * 64 * 128 * 4);
  CHECK(off->stats().stored_bytes == off->stats().bytes_written);
  loss.backward();
  const OffloadStats s = off->stats();
  CHECK(s.memory_hits == 0);
  CHECK(s.prefetch_hits >= 3);
  const std::vector<Tensor> got{net.w1.grad(), net.w2.grad(), net.w3.grad(), loss.detach()};
  CHECK(same_bits(plain, got));

  // A failed write keeps the tensor in memory and says so, as the thread does.
  OffloadOptions full = o;
  full.capacity_bytes = 64 * 128 * 4 + 10;
  auto off2 = std::make_shared<OffloadHooks>(full);
  for (Tensor* w : {&net.w1, &net.w2, &net.w3}) w->set_grad(Tensor());
  {
    SavedTensorHooksScope scope(off2);
    loss = net.forward(false);
  }
  CHECK_THROWS_WITH(off2->check(), Catch::Contains("No space left on device") &&
                                     Catch::Contains("the tensor stayed in memory, nothing is lost"));
  loss.backward();
  CHECK(same_bits(plain, {net.w1.grad(), net.w2.grad(), net.w3.grad(), loss.detach()}));
}

TEST_CASE("compression: bf16 and fp8 within stated bounds, alone and stacked", "[compress]") {
  Net net;
  const auto plain = net.grads(false, {});
  // Relative to the largest gradient entry: bf16 keeps 8 mantissa bits, MXFP8 3.
  const std::vector<std::pair<CompressFormat, double>> bounds{{CompressFormat::bf16, 0.01},
                                                              {CompressFormat::fp8, 0.08}};
  for (const auto& [fmt, bound] : bounds) {
    INFO(compress_format_name(fmt));
    CompressOptions co;
    co.format = fmt;
    auto comp = std::make_shared<CompressHooks>(co);
    const auto got = net.grads(false, {comp});
    const double err = rel_error(plain, got);
    INFO("relative gradient error " << err);
    CHECK(err > 0);  // lossy, and not hidden
    CHECK(err < bound);
    CHECK(same_bits({plain[3]}, {got[3]}));  // the forward itself is untouched
    const auto s = comp->stats();
    CHECK(s.saves == 3);  // the three matmuls' activation inputs, not their weights
    CHECK(double(s.compressed_bytes) / double(s.original_bytes) ==
          Approx(fmt == CompressFormat::bf16 ? 0.5 : (1.0 + 1.0 / 32) / 4));

    // Compressed saves, then offloaded: the offload moves the compressed
    // bytes, and the gradients are those of compression alone.
    auto comp2 = std::make_shared<CompressHooks>(co);
    auto off = std::make_shared<OffloadHooks>(small_offload());
    const auto stacked = net.grads(false, {off, comp2}, off.get());  // compress innermost
    CHECK(same_bits(got, stacked));
    CHECK(off->stats().bytes_written >= comp2->stats().compressed_bytes);

    // Around a checkpoint region: its boundary is compressed, its internal
    // saves are placeholders that pass by.
    auto comp3 = std::make_shared<CompressHooks>(co);
    const auto around = net.grads(true, {comp3});
    CHECK(comp3->stats().saves == 3);  // x@w1's input, the boundary, h@w3's input
    CHECK(rel_error(plain, around) < 2 * bound);
  }
  CompressOptions all;
  all.all_saves = true;
  auto every = std::make_shared<CompressHooks>(all);
  net.grads(false, {every});
  CHECK(every->stats().saves > 3);
  CHECK_THROWS_WITH(compress_format_from_name("int4"), Catch::Contains("unknown format 'int4'; valid formats are bf16 "
                                                                       "and fp8"));
}

// ---- CUDA (skipped without a device): pinned host memory, the side stream,
// prefetch, the pool, the version check, compression on the device.
namespace {

// Net's tensors on the GPU (the weights still parameters).
struct CudaNet : Net {
  CudaNet() {
    const Device gpu = cuda_device(0);
    x = x.to(gpu);
    for (Tensor* w : {&w1, &w2, &w3}) {
      CategoryScope cat(MemoryCategory::parameter);
      *w = w->detach().to(gpu);
      w->set_requires_grad(true);
    }
  }
};

}  // namespace

TEST_CASE("offload on CUDA is exact and moves the saves to pinned host memory", "[cuda][offload]") {
  CudaNet net;
  for (bool region : {false, true}) {
    INFO("region " << region);
    const auto plain = net.grads(region, {});
    auto off = std::make_shared<OffloadHooks>(small_offload());
    const auto offloaded = net.grads(region, {off}, off.get());
    CHECK(same_bits(plain, offloaded));
    const OffloadStats s = off->stats();
    CHECK(s.device_saves >= (region ? 5 : 6));
    CHECK(s.device_saves == s.saves);
    CHECK(s.bytes_written == 0);  // nothing went to the spill file
    CHECK(s.bytes_to_host > 0);
    CHECK(s.bytes_to_device > 0);
    CHECK(s.host_peak >= s.bytes_to_host);
    CHECK(s.host_bytes == 0);  // everything released after backward
    CHECK(s.pinned_allocs >= 1);
  }
}

TEST_CASE("offload on CUDA frees the device memory after the copies and prefetches in tape order",
          "[cuda][offload]") {
  CudaNet net;
  auto& alloc = allocator_for(cuda_device(0));
  auto held_after_forward = [&](std::shared_ptr<OffloadHooks> off, Tensor& loss) {
    std::optional<SavedTensorHooksScope> scope;
    if (off) scope.emplace(off);
    CategoryScope cat(MemoryCategory::activation);
    const std::int64_t before = alloc.stats().category(MemoryCategory::activation);
    loss = net.forward(false);
    if (off) off->flush();  // the copies are done: the device memory went
    return alloc.stats().category(MemoryCategory::activation) - before;
  };
  Tensor plain_loss, loss;
  const std::int64_t plain = held_after_forward(nullptr, plain_loss);
  plain_loss = Tensor();
  auto off = std::make_shared<OffloadHooks>(small_offload());
  const std::int64_t offloaded = held_after_forward(off, loss);
  const OffloadStats s = off->stats();
  INFO("device activation bytes held after the forward: " << plain << " plain, " << offloaded
                                                          << " offloaded; to host " << s.bytes_to_host);
  CHECK(s.bytes_to_host == 6 * 64 * 128 * 4);  // each save once (mul(h, h)'s two share one)
  CHECK(s.host_bytes == s.bytes_to_host);
  CHECK(offloaded < plain / 20);
  loss.backward();
  const OffloadStats b = off->stats();
  // Unpacks run newest first: the first finds nothing started, the earlier
  // saves were already on their way back.
  CHECK(b.sync_reads >= 1);
  CHECK(b.prefetch_hits >= 3);
  CHECK(b.memory_hits == 0);  // flushed: every save had left the device
  CHECK(b.bytes_to_device >= b.bytes_to_host);
  CHECK(b.host_bytes == 0);
}

TEST_CASE("offload on CUDA reuses its pinned buffers from step to step", "[cuda][offload]") {
  CudaNet net;
  auto off = std::make_shared<OffloadHooks>(small_offload());
  const auto first = net.grads(false, {off}, off.get());
  const OffloadStats s1 = off->stats();
  CHECK(s1.pinned_allocs >= 1);
  CHECK(s1.pinned_allocs <= s1.device_saves);
  for (int step = 0; step < 2; ++step) {
    const auto again = net.grads(false, {off}, off.get());
    CHECK(same_bits(first, again));
  }
  const OffloadStats s3 = off->stats();
  CHECK(s3.pinned_allocs == s1.pinned_allocs);  // later steps allocated none
  CHECK(s3.pinned_bytes == s1.pinned_bytes);
  CHECK(s3.device_saves == 3 * s1.device_saves);
  // Without a flush the copies may still be in flight when backward starts:
  // still exact.
  const auto unflushed = net.grads(false, {off});
  CHECK(same_bits(first, unflushed));
}

TEST_CASE("an in-place write to an offloaded or compressed CUDA tensor is still caught", "[cuda][offload]") {
  const Device gpu = cuda_device(0);
  for (int kind = 0; kind < 3; ++kind) {
    INFO((kind == 0 ? "offload" : kind == 1 ? "compress fp8" : "compress bf16"));
    Tensor w;
    {
      CategoryScope cat(MemoryCategory::parameter);
      w = param({128, 128}, 4, 0.1).detach().to(gpu);
    }
    w.set_requires_grad(true);
    Generator g(5);
    Tensor x = randn({64, 128}, DType::f32, &g).to(gpu);
    std::shared_ptr<SavedTensorHooks> hooks;
    if (kind == 0)
      hooks = std::make_shared<OffloadHooks>(small_offload());
    else
      hooks = std::make_shared<CompressHooks>(
          CompressOptions{kind == 1 ? CompressFormat::fp8 : CompressFormat::bf16, false, 4096});
    Tensor y;
    {
      SavedTensorHooksScope scope(hooks);
      y = matmul(x, w);
    }
    if (kind == 0) CHECK(std::static_pointer_cast<OffloadHooks>(hooks)->stats().device_saves == 1);
    if (kind > 0) CHECK(std::static_pointer_cast<CompressHooks>(hooks)->stats().saves == 1);
    x.fill_(1.0);
    CHECK_THROWS_WITH(sum(y).backward(), Catch::Contains("saved by op 'matmul'") &&
                                             Catch::Contains("was modified in place afterwards"));
  }
}

TEST_CASE("compression on CUDA: bf16 and fp8 within the CPU's bounds, stacked under offload", "[cuda][compress]") {
  CudaNet net;
  const auto plain = net.grads(false, {});
  for (const auto& [fmt, bound] : std::vector<std::pair<CompressFormat, double>>{{CompressFormat::bf16, 0.01},
                                                                                 {CompressFormat::fp8, 0.08}}) {
    INFO(compress_format_name(fmt));
    CompressOptions co;
    co.format = fmt;
    auto comp = std::make_shared<CompressHooks>(co);
    const auto got = net.grads(false, {comp});
    CHECK(comp->stats().saves == 3);  // taken on the device
    const double err = rel_error(plain, got);
    INFO("relative gradient error " << err);
    CHECK(err > 0);
    CHECK(err < bound);
    auto comp2 = std::make_shared<CompressHooks>(co);
    auto off = std::make_shared<OffloadHooks>(small_offload());
    const auto stacked = net.grads(false, {off, comp2}, off.get());
    CHECK(same_bits(got, stacked));
    CHECK(off->stats().bytes_to_host >= comp2->stats().compressed_bytes);
  }
}
