// CUDA back-end checks. Tagged [cuda]: without a GPU the test main skips
// them and says so.
#include <catch2/catch.hpp>

#include "cuda/allocator_backend.h"
#include "cuda/runtime.h"
#include "engine/rng.h"
#include "engine/tensor.h"

using namespace remat;

TEST_CASE("CUDA tensors round-trip through device memory", "[cuda]") {
  Tensor h = arange(0.0, 1000.0, 1.0);
  Tensor d = h.to(cuda_device(0));
  CHECK(d.device() == cuda_device(0));
  CHECK(d.to(kCPU).to_vector<float>() == h.to_vector<float>());
  CHECK(allocator_for(cuda_device(0)).stats().allocated_bytes >= 4000);
  Tensor z = zeros({3, 5}, cuda_device(0));
  CHECK(z.to(kCPU).to_vector<float>() == std::vector<float>(15, 0.0f));
  z.set({1, 2}, 7.0);
  CHECK(z.at({1, 2}) == 7.0);
}

TEST_CASE("the CUDA Philox kernels equal the CPU generator bit for bit", "[cuda]") {
  const RngState s{0x1234abcdull, 99};
  const std::int64_t n = 100003;
  Tensor du = empty({n}, cuda_device(0));
  Tensor dn = empty({n}, cuda_device(0));
  cuda::philox_uniform(du.data<float>(), n, s.seed, s.offset);
  cuda::philox_normal(dn.data<float>(), n, s.seed, s.offset);
  std::vector<float> hu(static_cast<std::size_t>(n)), hn(static_cast<std::size_t>(n));
  philox_fill_uniform(hu.data(), n, s);
  philox_fill_normal(hn.data(), n, s);
  CHECK(du.to_vector<float>() == hu);
  CHECK(dn.to_vector<float>() == hn);
}

TEST_CASE("the CUDA allocator caches and reports an OOM with its state", "[cuda]") {
  CachingAllocator& a = allocator_for(cuda_device(0));
  a.empty_cache();
  const auto before = a.stats();
  { DataPtr p = a.allocate(1 << 20); }
  { DataPtr p = a.allocate(1 << 20); }
  const auto after = a.stats();
  CHECK(after.num_device_allocs - before.num_device_allocs == 1);
  const auto limit = a.memory_limit();
  a.set_memory_limit(after.reserved_bytes + (64 << 20));
  CHECK_THROWS_AS(a.allocate(std::size_t(1) << 30), OutOfMemoryError);
  a.set_memory_limit(limit);
  CHECK(a.allocate(1 << 20));
}
