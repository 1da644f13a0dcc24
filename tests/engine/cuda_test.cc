// CUDA back-end checks, through the engine (the back end is whatever cuda/
// registered). Tagged [cuda]: without a GPU the test main skips them and says
// so. The first case runs everywhere: without a device (or without a back
// end) every way to a CUDA device is refused, naming the device.
#include <catch2/catch.hpp>

#include "engine/device_runtime.h"
#include "engine/rng.h"
#include "engine/tensor.h"

using namespace remat;

TEST_CASE("without a CUDA device, CUDA tensors, streams and device calls are refused clearly", "[engine]") {
  if (cuda_device_count() > 0) {
    SUCCEED("a device is present: the [cuda] cases below use it");
    return;
  }
  using Catch::Contains;
  CHECK_THROWS_AS(zeros({2}, cuda_device(0)), DeviceError);
  CHECK_THROWS_WITH(zeros({2}, cuda_device(0)), Contains("cuda:0"));
  CHECK_THROWS_WITH(ones({2}).to(cuda_device(1)), Contains("cuda:1"));
  CHECK_THROWS_AS(device_info(cuda_device(0)), DeviceError);
  CHECK_THROWS_AS(set_current_device(cuda_device(0)), DeviceError);
  CHECK_THROWS_AS(synchronize(cuda_device(0)), DeviceError);
  CHECK_NOTHROW(use_device_if_present(cuda_device(0)));
  CHECK_NOTHROW(synchronize(kCPU));
  if (!cuda_built()) {
    // No back end registered (a build without the toolkit).
    CHECK_THROWS_WITH(zeros({2}, cuda_device(0)), Contains("no CUDA device"));
    CHECK_THROWS_WITH(Stream(), Contains("no CUDA device"));
    CHECK_THROWS_WITH(Event(), Contains("no CUDA device"));
  } else {
    CHECK_THROWS_WITH(zeros({2}, cuda_device(0)), Contains("0 CUDA devices present"));
  }
  // The current stream is the thread's, with or without a device.
  CHECK(current_stream() == 0);
  {
    StreamGuard g(StreamId(42));
    CHECK(current_stream() == 42);
  }
  CHECK(current_stream() == 0);
}

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
  Generator gen;
  gen.set_state(s);
  Tensor du = rand({n}, cuda_device(0), &gen);
  gen.set_state(s);
  Tensor dn = randn({n}, cuda_device(0), &gen);
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
