#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "engine/dtype.h"
#include "engine/error.h"

using namespace remat;

TEST_CASE("dtype sizes and names", "[dtype]") {
  CHECK(element_size(DType::f32) == 4);
  CHECK(element_size(DType::bf16) == 2);
  CHECK(element_size(DType::f16) == 2);
  CHECK(element_size(DType::i32) == 4);
  CHECK(element_size(DType::i64) == 8);
  CHECK(element_size(DType::boolean) == 1);
  CHECK(element_size(DType::fp8_e4m3) == 1);
  CHECK(parse_dtype("bf16") == DType::bf16);
  CHECK(std::string(dtype_name(DType::boolean)) == "bool");
  CHECK_THROWS_AS(parse_dtype("f64"), DTypeError);
  CHECK_THROWS_WITH(parse_dtype("f64"), Catch::Contains("valid dtypes are"));
}

TEST_CASE("bf16 rounds to nearest even", "[dtype]") {
  CHECK(bf16(1.0f).bits == 0x3f80);
  CHECK(float(bf16(1.0f)) == 1.0f);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1 + 2^-7: ties to even (1.0).
  CHECK(bf16(1.0f + std::ldexp(1.0f, -8)).bits == 0x3f80);
  // 1 + 3*2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: rounds up.
  CHECK(bf16(1.0f + 3 * std::ldexp(1.0f, -8)).bits == 0x3f82);
  CHECK(std::isnan(float(bf16(std::nanf("")))));
  CHECK(std::isinf(float(bf16(std::numeric_limits<float>::infinity()))));
}

TEST_CASE("f16 conversion is exact on every finite half value", "[dtype]") {
  CHECK(f16(1.0f).bits == 0x3c00);
  CHECK(f16(65504.0f).bits == 0x7bff);
  CHECK(f16(65520.0f).bits == 0x7c00);          // rounds to infinity
  CHECK(f16(std::ldexp(1.0f, -24)).bits == 0x0001);  // smallest subnormal
  CHECK(f16(std::ldexp(1.0f, -25)).bits == 0x0000);  // tie to even -> 0
  CHECK(f16(std::ldexp(3.0f, -26)).bits == 0x0001);  // above the tie -> 1
  CHECK(f16(-2.0f).bits == 0xc000);
  int checked = 0;
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const std::uint16_t bits = std::uint16_t(h);
    if (((bits >> 10) & 0x1f) == 0x1f) continue;  // inf / NaN
    const float f = f16::to_float(bits);
    REQUIRE(f16::from_float(f) == bits);
    ++checked;
  }
  CHECK(checked == 63488);
}

TEST_CASE("fp8 e4m3 round trips and saturates", "[dtype]") {
  CHECK(fp8_e4m3(1.0f).bits == 0x38);
  CHECK(fp8_e4m3(448.0f).bits == 0x7e);
  CHECK(fp8_e4m3(1000.0f).bits == 0x7e);
  CHECK(fp8_e4m3(-1000.0f).bits == 0xfe);
  CHECK(float(fp8_e4m3(std::ldexp(1.0f, -9))) == std::ldexp(1.0f, -9));
  CHECK(std::isnan(fp8_e4m3::to_float(0x7f)));
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;
    const float f = fp8_e4m3::to_float(std::uint8_t(b));
    if (f == 0.0f) continue;  // -0 and +0
    REQUIRE(fp8_e4m3::from_float(f) == b);
  }
  // 1.0625 lies halfway between 1.0 and 1.125: ties to even (1.0).
  CHECK(fp8_e4m3(1.0625f).bits == 0x38);
}
