#include "ops/mxfp8.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>

#include <immintrin.h>

#include "engine/dtype.h"
#include "engine/error.h"
#include "engine/parallel_for.h"
#include "ops/kernel_util.h"

namespace remat {

namespace ops_detail {

std::uint8_t e4m3_encode(float v) {
  // Branch-free, so the block loops vectorise: each candidate is computed
  // and the right one selected.
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(v);
  const std::uint32_t sign = (bits >> 24) & 0x80u;
  const std::uint32_t u = bits & 0x7fffffffu;
  // Below 2^-6: e4m3 subnormals, unit 2^-9; a * 512 < 8, so adding 2^23
  // rounds it to an integer, to nearest even. (Zero for other inputs, so the
  // conversion to an integer stays in range.)
  const float a = std::bit_cast<float>(u < 0x3c800000u ? u : 0u);
  const std::uint32_t sub = std::uint32_t((a * 512.0f + 8388608.0f) - 8388608.0f);
  // Normal: round the mantissa to 3 bits, ties to even, rebias 127 -> 7,
  // saturate at 448 (inf too).
  std::uint32_t nrm = ((u + 0x7ffffu + ((u >> 20) & 1u)) >> 20) - (120u << 3);
  nrm = nrm > 0x7eu ? 0x7eu : nrm;
  std::uint32_t r = u < 0x3c800000u ? sub : nrm;
  r = u > 0x7f800000u ? 0x7fu : r;  // NaN
  return std::uint8_t(sign | r);
}

}  // namespace ops_detail

KernelTable<Mxfp8Kernels>& mxfp8_kernels() {
  static KernelTable<Mxfp8Kernels> t("mxfp8 codec");
  return t;
}

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

// One full block of 32 f32 values with AVX2 (the build's baseline): the
// same bits as the scalar path (the maximum by bits, e4m3_encode's formulas
// lane by lane).
void quantize_block_avx2(const float* x, std::uint8_t* codes, std::uint8_t* exp_out) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  __m256i v[4], amax = _mm256_setzero_si256();
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_castps_si256(_mm256_loadu_ps(x + 8 * k));
    __m256i m = _mm256_and_si256(v[k], abs_mask);
    m = _mm256_andnot_si256(_mm256_cmpgt_epi32(m, inf), m);  // NaN left out
    amax = _mm256_max_epu32(amax, m);
  }
  alignas(32) std::uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), amax);
  std::uint32_t amax_bits = 0;
  for (std::uint32_t l : lanes) amax_bits = l > amax_bits ? l : amax_bits;
  const int e = block_exponent(std::bit_cast<float>(amax_bits));
  *exp_out = std::uint8_t(e + 127);
  const __m256 inv = _mm256_set1_ps(std::ldexp(1.0f, -e));
  const __m256i sub_limit = _mm256_set1_epi32(0x3c800000), magic_i = _mm256_set1_epi32(0x4b000000);
  const __m256 magic = _mm256_castsi256_ps(magic_i), f512 = _mm256_set1_ps(512.0f);
  __m256i r[4];
  for (int k = 0; k < 4; ++k) {
    const __m256i bits = _mm256_castps_si256(_mm256_mul_ps(_mm256_castsi256_ps(v[k]), inv));
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80));
    const __m256i u = _mm256_and_si256(bits, abs_mask);
    const __m256i is_sub = _mm256_cmpgt_epi32(sub_limit, u);  // u < 2^-6
    const __m256 a = _mm256_castsi256_ps(_mm256_and_si256(u, is_sub));
    const __m256i sub = _mm256_cvttps_epi32(_mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(a, f512), magic), magic));
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 20), _mm256_set1_epi32(1));
    __m256i nrm = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7ffff)), odd), 20);
    nrm = _mm256_sub_epi32(nrm, _mm256_set1_epi32(120 << 3));
    nrm = _mm256_min_epu32(nrm, _mm256_set1_epi32(0x7e));
    __m256i q = _mm256_blendv_epi8(nrm, sub, is_sub);
    q = _mm256_blendv_epi8(q, _mm256_set1_epi32(0x7f), _mm256_cmpgt_epi32(u, inf));  // NaN
    r[k] = _mm256_or_si256(q, sign);
  }
  // 32 int32 (each < 256) -> 32 bytes in order.
  const __m256i p01 = _mm256_packus_epi32(r[0], r[1]), p23 = _mm256_packus_epi32(r[2], r[3]);
  const __m256i b = _mm256_packus_epi16(p01, p23);
  const __m256i ordered = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes), ordered);
}

template <typename T>
void quantize_rows(const T* x, std::int64_t n, std::uint8_t* codes, std::uint8_t* exps) {
  const std::int64_t blocks = (n + kMxBlock - 1) / kMxBlock;
  parallel_for(0, blocks, 512, [&](std::int64_t b0, std::int64_t b1) {
    float buf[kMxBlock];
    for (std::int64_t b = b0; b < b1; ++b) {
      const std::int64_t i0 = b * kMxBlock, len = std::min(kMxBlock, n - i0);
      if (len == kMxBlock) {
        const float* src = buf;
        if constexpr (std::is_same_v<T, float>) {
          src = x + i0;
        } else {
          for (std::int64_t i = 0; i < len; ++i) buf[i] = float(x[i0 + i]);
        }
        quantize_block_avx2(src, codes + i0, exps + b);
        continue;
      }
      // The last, partial block. The block's largest magnitude, compared as
      // bits (non-negative floats order as their bits); NaN is left out so
      // its block keeps a scale.
      std::uint32_t amax_bits = 0;
      for (std::int64_t i = 0; i < len; ++i) {
        buf[i] = float(x[i0 + i]);
        std::uint32_t m = std::bit_cast<std::uint32_t>(buf[i]) & 0x7fffffffu;
        m = m > 0x7f800000u ? 0u : m;
        amax_bits = m > amax_bits ? m : amax_bits;
      }
      const int e = block_exponent(std::bit_cast<float>(amax_bits));
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
  parallel_for(0, blocks, 512, [&](std::int64_t b0, std::int64_t b1) {
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

// The CPU codec: one pass over x, each block scanned for its maximum and
// then encoded while in cache.
Tensor quantize_cpu(const Tensor& src) {
  const std::int64_t n = src.numel();
  Tensor packed = empty({mxfp8_packed_numel(n)}, DType::fp8_e4m3);
  if (ops_detail::skip_compute(packed)) return packed;
  auto* codes = static_cast<std::uint8_t*>(packed.raw_data());
  with_float_type(src.dtype(), [&](auto tag) {
    using T = decltype(tag);
    quantize_rows(src.data<T>(), n, codes, codes + n);
  });
  return packed;
}

Tensor dequantize_cpu(const Tensor& packed, const Shape& sizes, DType dtype) {
  const std::int64_t n = shape_numel(sizes);
  Tensor out = empty(sizes, dtype);
  if (ops_detail::skip_compute(out)) return out;
  const auto* codes = static_cast<const std::uint8_t*>(packed.raw_data());
  with_float_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    dequantize_rows(codes, codes + n, n, out.data<T>());
  });
  return out;
}

const KernelRegistration<Mxfp8Kernels> kCpu(mxfp8_kernels(), DeviceType::CPU, {quantize_cpu, dequantize_cpu},
                                            KernelDTypes::native);

}  // namespace

std::int64_t mxfp8_packed_numel(std::int64_t n) { return n + (n + kMxBlock - 1) / kMxBlock; }

Tensor mxfp8_quantize(const Tensor& x) {
  REMAT_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16 || x.dtype() == DType::f16, DTypeError,
              "mxfp8_quantize: expected an f32, bf16 or f16 tensor, got ", x.dtype(), " of shape ",
              shape_str(x.sizes()));
  const Tensor src = x.detach().contiguous();
  return mxfp8_kernels().run(src.device(), &Mxfp8Kernels::quantize, src);
}

Tensor mxfp8_dequantize(const Tensor& packed, const Shape& sizes, DType dtype) {
  const std::int64_t n = shape_numel(sizes);
  REMAT_CHECK(packed.defined() && packed.dtype() == DType::fp8_e4m3 && packed.is_contiguous() &&
                  packed.numel() == mxfp8_packed_numel(n),
              Error, "mxfp8_dequantize: expected ", mxfp8_packed_numel(n), " packed fp8_e4m3 bytes for shape ",
              shape_str(sizes), ", got ", packed.defined() ? packed.numel() : 0);
  REMAT_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, DTypeError,
              "mxfp8_dequantize: expected f32, bf16 or f16 to decode into, got ", dtype);
  return mxfp8_kernels().run(packed.device(), &Mxfp8Kernels::dequantize, packed, sizes, dtype);
}

}  // namespace remat
