#include "ops/mxfp8.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>

#include "engine/dtype.h"
#include "engine/error.h"
#include "engine/parallel_for.h"

namespace remat {

namespace ops_detail {

std::uint8_t e4m3_encode(float v) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(v);
  const std::uint8_t sign = std::uint8_t((u >> 24) & 0x80u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7fu;     // NaN
  if (u >= 0x43e00000u) return sign | 0x7eu;    // >= 448 (and inf): the largest finite value
  if (u < 0x3c800000u) {                        // below 2^-6: e4m3 subnormals, unit 2^-9
    // a * 512 < 8, so adding 2^23 rounds it to an integer, to nearest even.
    const float q = (std::bit_cast<float>(u) * 512.0f + 8388608.0f) - 8388608.0f;
    return std::uint8_t(sign | std::uint8_t(q));
  }
  u += 0x7ffffu + ((u >> 20) & 1u);             // round the mantissa to 3 bits, ties to even
  std::uint32_t bits = (u >> 20) - (120u << 3);  // exponent bias 127 -> 7
  if (bits > 0x7eu) bits = 0x7eu;
  return std::uint8_t(sign | bits);
}

}  // namespace ops_detail

namespace {

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) t[std::size_t(b)] = fp8_e4m3::to_float(std::uint8_t(b));
    return t;
  }();
  return table;
}

// The block exponent e (-127..127) with max|x| * 2^-e <= 448.
int block_exponent(float amax) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return std::isfinite(amax) ? -127 : 127;
  int e = std::ilogb(amax) - 8;  // amax * 2^-e in [256, 512)
  if (std::ldexp(amax, -e) > 448.0f) ++e;
  return std::clamp(e, -127, 127);
}

template <typename T>
void quantize_rows(const T* x, std::int64_t n, std::uint8_t* codes, std::uint8_t* exps) {
  const std::int64_t blocks = (n + kMxBlock - 1) / kMxBlock;
  parallel_for(0, blocks, 2048, [&](std::int64_t b0, std::int64_t b1) {
    float buf[kMxBlock];
    for (std::int64_t b = b0; b < b1; ++b) {
      const std::int64_t i0 = b * kMxBlock, len = std::min(kMxBlock, n - i0);
      float amax = 0.0f;
      for (std::int64_t i = 0; i < len; ++i) {
        buf[i] = float(x[i0 + i]);
        const float a = std::fabs(buf[i]);
        amax = a > amax ? a : amax;  // NaN never wins: its block keeps a finite scale
      }
      const int e = block_exponent(amax);
      exps[b] = std::uint8_t(e + 127);
      const float inv = std::ldexp(1.0f, -e);
      for (std::int64_t i = 0; i < len; ++i) codes[i0 + i] = ops_detail::e4m3_encode(buf[i] * inv);
    }
  });
}

template <typename T>
void dequantize_rows(const std::uint8_t* codes, const std::uint8_t* exps, std::int64_t n, T* out) {
  const auto& table = e4m3_table();
  const std::int64_t blocks = (n + kMxBlock - 1) / kMxBlock;
  parallel_for(0, blocks, 2048, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b) {
      const std::int64_t i0 = b * kMxBlock, len = std::min(kMxBlock, n - i0);
      const float s = std::ldexp(1.0f, int(exps[b]) - 127);
      for (std::int64_t i = 0; i < len; ++i) out[i0 + i] = T(table[codes[i0 + i]] * s);
    }
  });
}

// fn(T{}) for the floating dtypes the codec takes.
template <typename Fn>
void with_float_type(DType t, Fn&& fn) {
  switch (t) {
    case DType::bf16: fn(bf16{}); return;
    case DType::f16: fn(f16{}); return;
    default: fn(float{}); return;
  }
}

}  // namespace

std::int64_t mxfp8_packed_numel(std::int64_t n) { return n + (n + kMxBlock - 1) / kMxBlock; }

Tensor mxfp8_quantize(const Tensor& x) {
  REMAT_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16 || x.dtype() == DType::f16, DTypeError,
              "mxfp8_quantize: expected an f32, bf16 or f16 tensor, got ", x.dtype(), " of shape ",
              shape_str(x.sizes()));
  REMAT_CHECK(x.device().is_cpu(), DeviceError, "mxfp8_quantize: the CPU codec got a tensor on ", x.device());
  const Tensor src = x.contiguous();
  const std::int64_t n = src.numel();
  Tensor packed = empty({mxfp8_packed_numel(n)}, DType::fp8_e4m3);
  auto* codes = static_cast<std::uint8_t*>(packed.raw_data());
  with_float_type(src.dtype(), [&](auto tag) {
    using T = decltype(tag);
    quantize_rows(src.data<T>(), n, codes, codes + n);
  });
  return packed;
}

Tensor mxfp8_dequantize(const Tensor& packed, const Shape& sizes, DType dtype) {
  const std::int64_t n = shape_numel(sizes);
  REMAT_CHECK(packed.defined() && packed.dtype() == DType::fp8_e4m3 && packed.is_contiguous() &&
                  packed.numel() == mxfp8_packed_numel(n),
              Error, "mxfp8_dequantize: expected ", mxfp8_packed_numel(n), " packed fp8_e4m3 bytes for shape ",
              shape_str(sizes), ", got ", packed.defined() ? packed.numel() : 0);
  REMAT_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, DTypeError,
              "mxfp8_dequantize: expected f32, bf16 or f16 to decode into, got ", dtype);
  Tensor out = empty(sizes, dtype);
  const auto* codes = static_cast<const std::uint8_t*>(packed.raw_data());
  with_float_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    dequantize_rows(codes, codes + n, n, out.data<T>());
  });
  return out;
}

}  // namespace remat
