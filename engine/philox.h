// Philox4x32-10 (Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3",
// SC'11), usable from host and device code, plus the engine's stream layout:
//
//   block b of the stream with state (seed, offset) is
//     philox4x32_10(counter = {lo32(offset + b), hi32(offset + b), 0, 0},
//                   key     = {lo32(seed), hi32(seed)})
//   element i of a draw is word i % 4 of block i / 4.
//
// A draw of n elements consumes ceil(n / 4) blocks, so CPU code and a GPU
// kernel (thread i computes block i) produce identical numbers. The float
// transforms below use only correctly rounded IEEE operations (no libm), so
// uniform and normal values are bit-identical on CPU and GPU as well.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define REMAT_HD __host__ __device__ __forceinline__
#else
#define REMAT_HD inline
#endif

namespace remat::philox {

struct Words {
  std::uint32_t v[4];
};

struct Floats {
  float v[4];
  REMAT_HD float operator[](int i) const { return v[i]; }
};

// Round-to-nearest float arithmetic that the compiler may not contract.
#if defined(__CUDA_ARCH__)
REMAT_HD float fmul(float a, float b) { return __fmul_rn(a, b); }
REMAT_HD float fadd(float a, float b) { return __fadd_rn(a, b); }
REMAT_HD float fdiv(float a, float b) { return __fdiv_rn(a, b); }
REMAT_HD float fsqrt(float a) { return __fsqrt_rn(a); }
REMAT_HD std::uint32_t float_bits(float f) { return __float_as_uint(f); }
REMAT_HD float bits_float(std::uint32_t u) { return __uint_as_float(u); }
#else
// Host code is built with -ffp-contract=off (.bazelrc), so these are the
// separately rounded IEEE operations.
REMAT_HD float fmul(float a, float b) { return a * b; }
REMAT_HD float fadd(float a, float b) { return a + b; }
REMAT_HD float fdiv(float a, float b) { return a / b; }
REMAT_HD float fsqrt(float a) { return __builtin_sqrtf(a); }
REMAT_HD std::uint32_t float_bits(float f) { return __builtin_bit_cast(std::uint32_t, f); }
REMAT_HD float bits_float(std::uint32_t u) { return __builtin_bit_cast(float, u); }
#endif

REMAT_HD void mulhilo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi, std::uint32_t& lo) {
  const std::uint64_t p = std::uint64_t(a) * std::uint64_t(b);
  hi = std::uint32_t(p >> 32);
  lo = std::uint32_t(p);
}

// The Philox4x32 bijection with 10 rounds (multipliers and Weyl constants
// from the paper).
REMAT_HD Words philox4x32_10(Words ctr, std::uint32_t k0, std::uint32_t k1) {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    std::uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kM0, ctr.v[0], hi0, lo0);
    mulhilo(kM1, ctr.v[2], hi1, lo1);
    ctr = Words{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
    k0 += kW0;
    k1 += kW1;
  }
  return ctr;
}

// Block `index` of the stream keyed by `seed` (index already includes the offset).
REMAT_HD Words block(std::uint64_t seed, std::uint64_t index) {
  return philox4x32_10(Words{{std::uint32_t(index), std::uint32_t(index >> 32), 0u, 0u}},
                       std::uint32_t(seed), std::uint32_t(seed >> 32));
}

// Uniform in [0, 1) from the top 24 bits (exact).
REMAT_HD float to_uniform(std::uint32_t x) { return float(x >> 8) * (1.0f / 16777216.0f); }

// Uniform in (0, 1] (never zero, for logarithms).
REMAT_HD float to_uniform_open0(std::uint32_t x) {
  return float((x >> 8) + 1u) * (1.0f / 16777216.0f);
}

// Natural log of u in (0, 1]: u = m * 2^e with m in [sqrt(1/2), sqrt(2)),
// log m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.172; five odd terms
// leave an error below 1e-9.
REMAT_HD float log_unit(float u) {
  // Split the bits: exponent e and mantissa m in [1, 2).
  const std::uint32_t bits = float_bits(u);
  int e = int((bits >> 23) & 0xffu) - 127;
  float m = bits_float((bits & 0x7fffffu) | 0x3f800000u);
  if (m > 1.41421356f) {
    m = fmul(m, 0.5f);
    e += 1;
  }
  const float s = fdiv(fadd(m, -1.0f), fadd(m, 1.0f));
  const float s2 = fmul(s, s);
  float p = 1.0f / 9.0f;
  p = fadd(fmul(p, s2), 1.0f / 7.0f);
  p = fadd(fmul(p, s2), 1.0f / 5.0f);
  p = fadd(fmul(p, s2), 1.0f / 3.0f);
  p = fadd(fmul(p, s2), 1.0f);
  const float log_m = fmul(fmul(2.0f, s), p);
  return fadd(fmul(float(e), 0.693147180559945309f), log_m);
}

// sin and cos of 2*pi*u for u in [0, 1): reduce to the nearest quarter turn,
// then Taylor polynomials on [-pi/4, pi/4].
REMAT_HD void sincos_turns(float u, float& s, float& c) {
  const float q = fmul(u, 4.0f);  // exact
  int k = int(fadd(q, 0.5f));     // nearest quarter, 0..4
  const float r = fadd(q, -float(k));  // in [-0.5, 0.5], exact
  const float x = fmul(r, 1.57079632679489662f);
  const float x2 = fmul(x, x);
  // sin x = x (1 - x^2/6 (1 - x^2/20 (1 - x^2/42 (1 - x^2/72))))
  float ps = fadd(1.0f, -fmul(x2, 1.0f / 72.0f));
  ps = fadd(1.0f, -fmul(fmul(x2, 1.0f / 42.0f), ps));
  ps = fadd(1.0f, -fmul(fmul(x2, 1.0f / 20.0f), ps));
  ps = fadd(1.0f, -fmul(fmul(x2, 1.0f / 6.0f), ps));
  const float sx = fmul(x, ps);
  // cos x = 1 - x^2/2 (1 - x^2/12 (1 - x^2/30 (1 - x^2/56 (1 - x^2/90))))
  float pc = fadd(1.0f, -fmul(x2, 1.0f / 90.0f));
  pc = fadd(1.0f, -fmul(fmul(x2, 1.0f / 56.0f), pc));
  pc = fadd(1.0f, -fmul(fmul(x2, 1.0f / 30.0f), pc));
  pc = fadd(1.0f, -fmul(fmul(x2, 1.0f / 12.0f), pc));
  const float cx = fadd(1.0f, -fmul(fmul(x2, 0.5f), pc));
  switch (k & 3) {
    case 0: s = sx; c = cx; break;
    case 1: s = cx; c = -sx; break;
    case 2: s = -sx; c = -cx; break;
    default: s = -cx; c = sx; break;
  }
}

// Four standard normals from one block: Box-Muller on words (0, 1) and (2, 3).
REMAT_HD Floats normals(Words w) {
  Floats out;
  for (int pair = 0; pair < 2; ++pair) {
    const float u1 = to_uniform_open0(w.v[2 * pair]);
    const float u2 = to_uniform(w.v[2 * pair + 1]);
    const float radius = fsqrt(fmul(-2.0f, log_unit(u1)));
    float s, c;
    sincos_turns(u2, s, c);
    out.v[2 * pair] = fmul(radius, c);
    out.v[2 * pair + 1] = fmul(radius, s);
  }
  return out;
}

}  // namespace remat::philox
