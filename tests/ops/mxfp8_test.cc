// The MXFP8 codec (ops/mxfp8.h): the fast e4m3 encoder against the reference
// conversion, the round trip's error bound, special values, layouts, threads.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "engine/parallel_for.h"
#include "gradcheck.h"
#include "ops/mxfp8.h"
#include "ops/ops.h"

using namespace remat;
using namespace remat::testing;

namespace {
Tensor rt(const Tensor& x) { return mxfp8_dequantize(mxfp8_quantize(x), x.sizes(), x.dtype()); }
}  // namespace

TEST_CASE("e4m3_encode equals the reference conversion", "[mxfp8]") {
  std::vector<float> probe;
  for (int b = 0; b < 256; ++b) {  // every code, and the midpoints next to it
    const float v = fp8_e4m3::to_float(std::uint8_t(b));
    if (std::isnan(v)) continue;
    probe.push_back(v);
    probe.push_back(std::nextafter(v, 1000.0f));
    probe.push_back(std::nextafter(v, -1000.0f));
    const float w = fp8_e4m3::to_float(std::uint8_t(b + 1));
    if (std::isfinite(w) && (b & 0x7f) != 0x7f) probe.push_back(0.5f * (v + w));
  }
  Tensor r = uniform({20000}, -600, 600, 1);
  for (float v : r.to_vector<float>()) probe.push_back(v);
  Tensor s = uniform({20000}, -0.05, 0.05, 2);
  for (float v : s.to_vector<float>()) probe.push_back(v);
  probe.push_back(std::numeric_limits<float>::infinity());
  probe.push_back(-std::numeric_limits<float>::infinity());
  probe.push_back(1e-30f);
  probe.push_back(-0.0f);
  std::int64_t bad = 0;
  for (float v : probe)
    if (ops_detail::e4m3_encode(v) != fp8_e4m3(v).bits) {
      if (bad++ < 5) UNSCOPED_INFO("value " << v << ": " << int(ops_detail::e4m3_encode(v)) << " vs "
                                            << int(fp8_e4m3(v).bits));
    }
  CHECK(bad == 0);
  CHECK(ops_detail::e4m3_encode(std::nanf("")) == 0x7f);
}

TEST_CASE("mxfp8 round trip: bounded error, exact where representable", "[mxfp8]") {
  // Blocks of very different magnitudes, a length that is not a multiple of 32.
  const std::int64_t n = 32 * 37 + 5;
  std::vector<float> v = normal({n}, 3).to_vector<float>();
  for (std::int64_t i = 0; i < n; ++i) v[std::size_t(i)] *= std::ldexp(1.0f, int((i / 32) % 41) - 20);
  Tensor x = from_vector<float>(v, {n});
  const Tensor q = mxfp8_quantize(x);
  CHECK(q.numel() == n + 38);
  CHECK(q.nbytes() == std::size_t(n + 38));
  const auto y = mxfp8_dequantize(q, {n}, DType::f32).to_vector<float>();
  for (std::int64_t b = 0; b * 32 < n; ++b) {
    float amax = 0;
    for (std::int64_t i = b * 32; i < std::min(n, b * 32 + 32); ++i) amax = std::max(amax, std::abs(v[std::size_t(i)]));
    // 3 mantissa bits: half an ulp is 2^-4 relative; below e4m3's normal range
    // (2^-6 of the scaled block) the absolute step is 2^-9 of the scale.
    const float scale = amax / 448.0f * 2.0f;  // >= the block's power-of-two scale
    for (std::int64_t i = b * 32; i < std::min(n, b * 32 + 32); ++i) {
      const float e = std::abs(y[std::size_t(i)] - v[std::size_t(i)]);
      const float bound = std::max(std::abs(v[std::size_t(i)]) * 0.0625f, scale * std::ldexp(1.0f, -10));
      if (!(e <= bound)) FAIL("element " << i << ": " << v[std::size_t(i)] << " -> " << y[std::size_t(i)]);
    }
  }
  // Values that e4m3 holds exactly (times a power of two) come back exactly.
  Tensor exact = from_vector<float>({1.0f, -1.5f, 448.0f, 0.0f, 3.25f * 1024.0f, -0.015625f}, {6});
  CHECK(rt(exact).to_vector<float>() == exact.to_vector<float>());
}

TEST_CASE("mxfp8: special values, dtypes, layouts, thread counts", "[mxfp8]") {
  const float inf = std::numeric_limits<float>::infinity();
  Tensor x = from_vector<float>({1.0f, std::nanf(""), -2.0f, 0.5f}, {4});
  const auto y = rt(x).to_vector<float>();
  CHECK(y[0] == 1.0f);
  CHECK(std::isnan(y[1]));
  CHECK(y[2] == -2.0f);
  Tensor z = from_vector<float>(std::vector<float>(40, 0.0f), {40});
  CHECK(rt(z).to_vector<float>() == std::vector<float>(40, 0.0f));
  Tensor big = from_vector<float>({inf, 1.0f}, {2});
  CHECK(rt(big).to_vector<float>()[0] == inf);  // not hidden

  // bf16 in, bf16 out; a transposed view is read in its logical order.
  Tensor a = normal({48, 20}, 4);
  CHECK(rt(cast(a, DType::bf16)).dtype() == DType::bf16);
  Tensor at = a.transpose(0, 1);
  CHECK(rt(at).to_vector<float>() ==
        rt(at.contiguous()).to_vector<float>());

  Tensor w = normal({300000}, 5);
  std::vector<float> ref;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    const auto out = rt(w).to_vector<float>();
    if (ref.empty()) ref = out;
    CHECK(std::memcmp(out.data(), ref.data(), ref.size() * sizeof(float)) == 0);
  }
  set_num_threads(2);
  CHECK_THROWS_WITH(mxfp8_quantize(arange(0, 4, 1, DType::i64)),
                    Catch::Contains("mxfp8_quantize: expected an f32, bf16 or f16 tensor, got i64"));
}

TEST_CASE("mxfp8: the vector block path gives the reference codes and exponents", "[mxfp8]") {
  // Full blocks (the AVX2 path) and a partial one, values of every scale,
  // zeros, subnormal results, NaN and inf, and maxima right at 448 * 2^e.
  const std::int64_t n = 32 * 64 + 9;
  std::vector<float> v = normal({n}, 9).to_vector<float>();
  for (std::int64_t i = 0; i < n; ++i) v[std::size_t(i)] *= std::ldexp(1.0f, int((i / 32) % 60) - 30);
  for (std::int64_t i = 0; i < 32; ++i) v[std::size_t(64 + i)] = 0.0f;              // an all-zero block
  v[200] = std::nanf("");
  v[300] = std::numeric_limits<float>::infinity();
  for (std::int64_t i = 0; i < 32; ++i) v[std::size_t(400 + i)] = i == 3 ? 448.0f * 4 : 1e-6f * float(i);
  const Tensor q = mxfp8_quantize(from_vector<float>(v, {n}));
  const auto* bytes = static_cast<const std::uint8_t*>(q.raw_data());
  std::int64_t bad = 0;
  for (std::int64_t b = 0; b * 32 < n; ++b) {
    float amax = 0;
    for (std::int64_t i = b * 32; i < std::min(n, b * 32 + 32); ++i)
      if (!std::isnan(v[std::size_t(i)])) amax = std::max(amax, std::abs(v[std::size_t(i)]));
    int e = -127;  // the smallest exponent that brings amax to <= 448
    if (std::isinf(amax))
      e = 127;
    else
      while (e < 127 && std::ldexp(amax, -e) > 448.0f) ++e;
    if (int(bytes[n + b]) - 127 != e) ++bad;
    for (std::int64_t i = b * 32; i < std::min(n, b * 32 + 32); ++i)
      if (bytes[i] != fp8_e4m3(v[std::size_t(i)] * std::ldexp(1.0f, -e)).bits) {
        if (bad++ < 5) UNSCOPED_INFO("element " << i << " value " << v[std::size_t(i)] << " exponent " << e);
      }
  }
  CHECK(bad == 0);
}

// ---- CUDA (skipped without a device): the kernel's codes, exponents and
// decoded values are the CPU codec's, bit for bit.
namespace {
bool same_bytes(const Tensor& cpu, const Tensor& dev) {
  const Tensor back = dev.to(kCPU);
  return cpu.dtype() == back.dtype() && cpu.nbytes() == back.nbytes() &&
         std::memcmp(cpu.raw_data(), back.raw_data(), cpu.nbytes()) == 0;
}
}  // namespace

TEST_CASE("mxfp8 on CUDA: the CPU codec's bits, in and out, every dtype", "[cuda][mxfp8]") {
  const Device gpu = cuda_device(0);
  // Blocks of every scale, an all-zero block, subnormal results, NaN, inf,
  // maxima right at 448 * 2^e, tiny (subnormal f32) maxima, a partial block.
  const std::int64_t n = 32 * 200 + 9;
  std::vector<float> v = normal({n}, 11).to_vector<float>();
  for (std::int64_t i = 0; i < n; ++i) v[std::size_t(i)] *= std::ldexp(1.0f, int((i / 32) % 90) - 60);
  for (std::int64_t i = 0; i < 32; ++i) v[std::size_t(64 + i)] = 0.0f;
  v[200] = std::nanf("");
  v[300] = std::numeric_limits<float>::infinity();
  v[333] = -std::numeric_limits<float>::infinity();
  for (std::int64_t i = 0; i < 32; ++i) v[std::size_t(400 + i)] = i == 3 ? 448.0f * 4 : 1e-6f * float(i);
  for (std::int64_t i = 0; i < 32; ++i) v[std::size_t(480 + i)] = std::ldexp(float(i), -149);  // subnormal max
  for (std::int64_t i = 0; i < 32; ++i) v[std::size_t(512 + i)] = i == 7 ? 448.0f * 0.5f * 1.0001f : 0.1f;
  const Tensor x32 = from_vector<float>(v, {n});
  for (DType in : {DType::f32, DType::bf16, DType::f16}) {
    INFO("input " << in);
    const Tensor x = cast(x32, in);
    const Tensor q_cpu = mxfp8_quantize(x);
    const Tensor q_gpu = mxfp8_quantize(x.to(gpu));
    CHECK(q_gpu.device() == gpu);
    CHECK(same_bytes(q_cpu, q_gpu));
    for (DType out : {DType::f32, DType::bf16, DType::f16}) {
      INFO("output " << out);
      const Tensor y_gpu = mxfp8_dequantize(q_gpu, {n}, out);
      CHECK(y_gpu.device() == gpu);
      CHECK(same_bytes(mxfp8_dequantize(q_cpu, {n}, out), y_gpu));
    }
  }
  // A strided view is read in its logical order, as on the CPU.
  const Tensor a = normal({48, 20}, 12);
  CHECK(same_bytes(mxfp8_quantize(a.transpose(0, 1)), mxfp8_quantize(a.to(gpu).transpose(0, 1))));
  // Large: many warps per launch, a grid-stride loop.
  const Tensor big = normal({(1 << 22) + 17}, 13);
  CHECK(same_bytes(mxfp8_quantize(big), mxfp8_quantize(big.to(gpu))));
}
