// One instruction set's float vectors for the run-time dispatched CPU kernels
// (ops/simd.h): loads and stores (whole or the first lanes), arithmetic, and
// a deterministic exp. Internal to ops/.
//
// Deliberately no include guard: a kernel file includes this once per
// instruction set, inside a namespace of its own, after including
// <immintrin.h> and defining
//   REMAT_SIMD_WIDTH  8 (AVX2 + FMA, the build's baseline) or 16 (AVX-512F)
//   REMAT_SIMD_FN     the attribute that enables that instruction set on a
//                     function (empty for AVX2), put on every function here.
// Every operation is element-wise and exactly rounded (fma rounds once), so a
// lane's result never depends on the width: both paths give the same bits.

#if !defined(REMAT_SIMD_WIDTH) || !defined(REMAT_SIMD_FN)
#error "define REMAT_SIMD_WIDTH and REMAT_SIMD_FN before including ops/vec_math.h"
#endif

constexpr int kW = REMAT_SIMD_WIDTH;  // floats per vector

#if REMAT_SIMD_WIDTH == 16

using vf = __m512;
using vmask = __mmask16;  // lanes of a partial vector
// All lanes. The maskz forms below with it are the plain instructions; GCC 12
// warns (-Wmaybe-uninitialized) inside the unmasked intrinsics' headers.
constexpr vmask kAll = 0xFFFF;

REMAT_SIMD_FN inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
REMAT_SIMD_FN inline void vstore(float* p, vf v) { _mm512_storeu_ps(p, v); }
// Lanes [0, n) for 0 <= n <= kW.
REMAT_SIMD_FN inline vmask vfirst(std::int64_t n) {
  return n >= kW ? kAll : vmask((1u << unsigned(n)) - 1u);
}
// Loads the lanes of `m` (the others read as 0, never touching memory).
REMAT_SIMD_FN inline vf vload(const float* p, vmask m) { return _mm512_maskz_loadu_ps(m, p); }
REMAT_SIMD_FN inline void vstore(float* p, vf v, vmask m) { _mm512_mask_storeu_ps(p, m, v); }
REMAT_SIMD_FN inline vf vset1(float x) { return _mm512_set1_ps(x); }
REMAT_SIMD_FN inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
REMAT_SIMD_FN inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
REMAT_SIMD_FN inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
REMAT_SIMD_FN inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
// a * b + c, rounded once.
REMAT_SIMD_FN inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
// max / min return b where either is NaN (x86 semantics), so pass the value
// that may be NaN second to keep it.
REMAT_SIMD_FN inline vf vmax(vf a, vf b) { return _mm512_maskz_max_ps(kAll, a, b); }
REMAT_SIMD_FN inline vf vmin(vf a, vf b) { return _mm512_maskz_min_ps(kAll, a, b); }
// m ? a : b, lane by lane.
REMAT_SIMD_FN inline vf vselect(vmask m, vf a, vf b) { return _mm512_mask_blend_ps(m, b, a); }
REMAT_SIMD_FN inline vmask vless(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
REMAT_SIMD_FN inline vf vround_even(vf x) {
  return _mm512_maskz_roundscale_ps(kAll, x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
// x * 2^n for integral n in [-125, 127] and x in [0.5, 2): n added to the exponent field.
REMAT_SIMD_FN inline vf vscale_pow2(vf x, vf n) {
  const __m512i e = _mm512_maskz_slli_epi32(kAll, _mm512_maskz_cvtps_epi32(kAll, n), 23);
  return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(x), e));
}

// Lanes (i, i + 8) of one 16-lane group (one vector here) combined. (The
// maskz extracts: GCC 12 warns inside _mm512_castps512_ps256 as above.)
REMAT_SIMD_FN inline __m256 vhalf(vf v, int hi) {
  const __m512d x = _mm512_castps_pd(v);
  return _mm256_castpd_ps(hi ? _mm512_maskz_extractf64x4_pd(0xFF, x, 1)
                             : _mm512_maskz_extractf64x4_pd(0xFF, x, 0));
}
REMAT_SIMD_FN inline __m256 vfold_sum16(const vf* g) {
  return _mm256_add_ps(vhalf(g[0], 0), vhalf(g[0], 1));
}
REMAT_SIMD_FN inline __m256 vfold_max16(const vf* g) {
  return _mm256_max_ps(vhalf(g[0], 0), vhalf(g[0], 1));
}

#elif REMAT_SIMD_WIDTH == 8

using vf = __m256;
using vmask = __m256i;

REMAT_SIMD_FN inline vf vload(const float* p) { return _mm256_loadu_ps(p); }
REMAT_SIMD_FN inline void vstore(float* p, vf v) { _mm256_storeu_ps(p, v); }
REMAT_SIMD_FN inline vmask vfirst(std::int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
REMAT_SIMD_FN inline vf vload(const float* p, vmask m) { return _mm256_maskload_ps(p, m); }
REMAT_SIMD_FN inline void vstore(float* p, vf v, vmask m) { _mm256_maskstore_ps(p, m, v); }
REMAT_SIMD_FN inline vf vset1(float x) { return _mm256_set1_ps(x); }
REMAT_SIMD_FN inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
REMAT_SIMD_FN inline vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
REMAT_SIMD_FN inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
REMAT_SIMD_FN inline vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
REMAT_SIMD_FN inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
REMAT_SIMD_FN inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
REMAT_SIMD_FN inline vf vmin(vf a, vf b) { return _mm256_min_ps(a, b); }
REMAT_SIMD_FN inline vf vselect(vmask m, vf a, vf b) {
  return _mm256_blendv_ps(b, a, _mm256_castsi256_ps(m));
}
REMAT_SIMD_FN inline vmask vless(vf a, vf b) {
  return _mm256_castps_si256(_mm256_cmp_ps(a, b, _CMP_LT_OQ));
}
REMAT_SIMD_FN inline vf vround_even(vf x) {
  return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
REMAT_SIMD_FN inline vf vscale_pow2(vf x, vf n) {
  const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
  return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(x), e));
}

// Lanes (i, i + 8) of one 16-lane group (two vectors here) combined.
REMAT_SIMD_FN inline __m256 vfold_sum16(const vf* g) { return _mm256_add_ps(g[0], g[1]); }
REMAT_SIMD_FN inline __m256 vfold_max16(const vf* g) { return _mm256_max_ps(g[0], g[1]); }

#else
#error "REMAT_SIMD_WIDTH must be 8 or 16"
#endif

// The sum (max) of a 16-lane group g (16 / kW vectors) in the fixed tree
// (i, i + 8), (i, i + 4), (i, i + 2), (i, i + 1): the same bits on every path.
REMAT_SIMD_FN inline float vtree_sum16(const vf* g) {
  const __m256 h = vfold_sum16(g);
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps(d, d, 1)));
}
REMAT_SIMD_FN inline float vtree_max16(const vf* g) {
  const __m256 h = vfold_max16(g);
  const __m128 q = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 d = _mm_max_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_max_ss(d, _mm_shuffle_ps(d, d, 1)));
}

REMAT_SIMD_FN inline vf vzero() { return vset1(0.0f); }

// exp(x), lane by lane: x = n ln2 + r with n = round(x / ln2) and |r| <= ln2/2,
// e^r from its Taylor series to r^7 (Horner, one rounding per fma), times 2^n.
// Within 1 ulp of the exact value on [-86.5, 88.37] (0.92 ulp at worst over a
// dense sweep); 0 below -86.5 (results under 2.8e-38 flush to zero, -inf
// included), +inf above 88.37; NaN stays NaN.
REMAT_SIMD_FN inline vf vexp(vf x) {
  constexpr float kLo = -86.5f, kHi = 88.37f;
  const vf xc = vmax(vset1(kLo), vmin(vset1(kHi), x));        // NaN passes through
  const vf n = vround_even(vmul(xc, vset1(0x1.715476p+0f)));  // x / ln2
  vf r = vfma(n, vset1(-0x1.62e430p-1f), xc);                 // ln2, high part
  r = vfma(n, vset1(0x1.05c610p-29f), r);                     // ln2, low part
  vf p = vset1(0x1.a01a02p-13f);                              // 1/7!
  p = vfma(p, r, vset1(0x1.6c16c2p-10f));                     // 1/6!
  p = vfma(p, r, vset1(0x1.111112p-7f));                      // 1/5!
  p = vfma(p, r, vset1(0x1.555556p-5f));                      // 1/4!
  p = vfma(p, r, vset1(0x1.555556p-3f));                      // 1/3!
  p = vfma(p, r, vset1(0.5f));
  p = vfma(p, r, vset1(1.0f));
  p = vfma(p, r, vset1(1.0f));
  const vf y = vscale_pow2(p, n);
  const vf inf = vset1(__builtin_inff());
  return vselect(vless(x, vset1(kLo)), vzero(), vselect(vless(vset1(kHi), x), inf, y));
}

// exp of one float through the vector code (the same bits as a lane of vexp).
REMAT_SIMD_FN inline float vexp1(float x) {
  float out[kW];
  vstore(out, vexp(vset1(x)));
  return out[0];
}
