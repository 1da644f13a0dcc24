// Element types and the 16-bit / 8-bit float formats the engine stores.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>

namespace remat {

// f32, bf16, f16: floating compute types. i32, i64: indices. boolean: masks
// (one byte per element). fp8_e4m3: storage only, for compressed saved tensors.
enum class DType : std::uint8_t { f32, bf16, f16, i32, i64, boolean, fp8_e4m3 };

// Bytes per element.
constexpr std::size_t element_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::boolean: return 1;
    case DType::fp8_e4m3: return 1;
  }
  return 0;
}

// True for f32, bf16, f16 (the dtypes that can require grad).
constexpr bool is_floating(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16;
}

// Short name: "f32", "bf16", "f16", "i32", "i64", "bool", "fp8_e4m3".
const char* dtype_name(DType t);
// Parses a short name; throws DTypeError listing the valid names otherwise.
DType parse_dtype(const std::string& name);

std::ostream& operator<<(std::ostream& os, DType t);

// bfloat16: the top half of an IEEE f32. Conversion rounds to nearest even;
// NaN stays NaN.
struct bf16 {
  std::uint16_t bits = 0;

  bf16() = default;
  explicit bf16(float f) : bits(from_float(f)) {}
  explicit operator float() const { return std::bit_cast<float>(std::uint32_t(bits) << 16); }

  static std::uint16_t from_float(float f) {
    std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x40);  // quiet NaN
    std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return std::uint16_t((u + rounding) >> 16);
  }
};

// IEEE binary16. Conversion rounds to nearest even, handles subnormals,
// overflows to infinity.
struct f16 {
  std::uint16_t bits = 0;

  f16() = default;
  explicit f16(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }

  static std::uint16_t from_float(float f);
  static float to_float(std::uint16_t h);
};

// OCP FP8 E4M3 (bias 7, no infinities, max 448, NaN = S.1111.111).
// Conversion saturates to ±448 and rounds to nearest even.
struct fp8_e4m3 {
  std::uint8_t bits = 0;

  fp8_e4m3() = default;
  explicit fp8_e4m3(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }

  static std::uint8_t from_float(float f);
  static float to_float(std::uint8_t b);
};

// Maps a C++ element type to its DType (compile-time).
template <typename T>
struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<std::int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<std::int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::boolean; };
template <> struct dtype_of<fp8_e4m3> { static constexpr DType value = DType::fp8_e4m3; };

template <typename T>
inline constexpr DType dtype_v = dtype_of<T>::value;

// Calls fn(T{}) with T the C++ element type of `t` (float, bf16, f16, int32_t,
// int64_t, bool, fp8_e4m3).
template <typename Fn>
decltype(auto) visit_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::f32: return fn(float{});
    case DType::bf16: return fn(bf16{});
    case DType::f16: return fn(f16{});
    case DType::i32: return fn(std::int32_t{});
    case DType::i64: return fn(std::int64_t{});
    case DType::boolean: return fn(bool{});
    case DType::fp8_e4m3: return fn(fp8_e4m3{});
  }
  return fn(float{});
}

// Converts any element type to double / from double (used by casts, printing
// and element access; not a hot path for floats, which have their own kernels).
template <typename T>
inline double to_double(T v) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16> || std::is_same_v<T, fp8_e4m3>)
    return double(float(v));
  else
    return double(v);
}

template <typename T>
inline T from_double(double v) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16> || std::is_same_v<T, fp8_e4m3>)
    return T(float(v));
  else if constexpr (std::is_same_v<T, bool>)
    return v != 0.0;
  else
    return static_cast<T>(v);
}

}  // namespace remat
