#include "engine/dtype.h"

#include "engine/error.h"

namespace remat {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::boolean: return "bool";
    case DType::fp8_e4m3: return "fp8_e4m3";
  }
  return "?";
}

DType parse_dtype(const std::string& name) {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64, DType::boolean,
                  DType::fp8_e4m3}) {
    if (name == dtype_name(t)) return t;
  }
  throw DTypeError("unknown dtype '" + name +
                   "'; valid dtypes are f32, bf16, f16, i32, i64, bool, fp8_e4m3");
}

std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

// Binary16 layout: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
std::uint16_t f16::from_float(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;           // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;          // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                                // below 2^-14: subnormal or zero
    if (abs < 0x33000000u) return sign;                   // below 2^-25 rounds to zero
    const int exp = int(abs >> 23);                       // biased f32 exponent
    const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    // value = mant * 2^(exp - 150) and the subnormal unit is 2^-24, so the
    // result is mant * 2^(exp - 126), rounded to nearest even.
    const int shift = 126 - exp;
    std::uint32_t q = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return std::uint16_t(sign | q);
  }
  // Normal: rebias exponent (127 -> 15) and round the mantissa from 23 to 10 bits.
  std::uint32_t v = abs - (112u << 23);
  const std::uint32_t rem = v & 0x1fffu;
  v >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (v & 1u))) ++v;
  return std::uint16_t(sign | v);
}

float f16::to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24.
    const float v = std::ldexp(float(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

// E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; S.1111.111 is NaN.
std::uint8_t fp8_e4m3::from_float(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint8_t sign = std::uint8_t((u >> 24) & 0x80u);
  if (std::isnan(f)) return sign | 0x7fu;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7eu;  // saturate to the largest finite value
  // Smallest normal is 2^-6; subnormal unit is 2^-9.
  if (a < std::ldexp(1.0f, -6)) {
    const float q = std::nearbyint(a * 512.0f);  // round half to even (default mode)
    return std::uint8_t(sign | std::uint8_t(q));  // q == 8 is the smallest normal: still right
  }
  int e = 0;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  // a = (1 + k/8) * 2^(e-1), k = round((2m - 1) * 8).
  float k = std::nearbyint((2.0f * m - 1.0f) * 8.0f);
  int exp = e - 1 + 7;
  if (k >= 8.0f) {
    k = 0.0f;
    ++exp;
  }
  std::uint8_t bits = std::uint8_t((exp << 3) | int(k));
  if (bits > 0x7eu) bits = 0x7eu;
  return std::uint8_t(sign | bits);
}

float fp8_e4m3::to_float(std::uint8_t b) {
  const bool neg = b & 0x80u;
  const int exp = (b >> 3) & 0xf;
  const int mant = b & 0x7;
  float v;
  if (exp == 15 && mant == 7) return std::nanf("");
  if (exp == 0)
    v = std::ldexp(float(mant), -9);
  else
    v = std::ldexp(1.0f + float(mant) / 8.0f, exp - 7);
  return neg ? -v : v;
}

}  // namespace remat
