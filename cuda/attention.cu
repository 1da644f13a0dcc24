// Fused causal / non-causal attention, forward and backward, flash-attention
// style: a block owns a tile of rows, streams the other side's tiles through
// shared memory and never writes an S x S matrix to global memory.
//
// Two policies supply the tile products and the tile geometry:
//  - MmaPolicy (bf16, f16): 64 x 64 tiles, 4 warps, tensor cores through
//    nvcuda::wmma (16x16x16 fragments, f32 accumulation). The accumulator
//    fragment layout is unspecified, so each kernel reads it back once from a
//    probe fragment loaded from a known matrix (Map), which lets it scale
//    accumulator rows and mask score elements in registers.
//  - FmaPolicy (f32): 32 x 32 tiles, 128 threads, each thread an explicit
//    register micro-tile of f32 FMAs (the correctness reference).
// Head dims up to 128 are padded with zeros to the policy's D (16/32/64/128).
//
// Forward (one block per query tile): K / V tiles double-buffered (cp.async
// for 16-bit rows, the next tile loading during this one's math), S = Q K^T
// into shared memory, an online softmax per row (running max and sum in f32,
// one thread group per row) writing P over S, O += P V with O in f32
// registers rescaled per row. Fully masked key tiles are never visited.
// Writes O and the row log-sum-exp.
// Backward: delta = rowsum(dO * O); then one kernel per key tile for dK, dV
// (looping over query tiles) and one per query tile for dQ (looping over key
// tiles), each recomputing P = exp(S * scale - lse) and dS = scale * P (dP -
// delta). Every output element is owned by one block and summed in a fixed
// order: the same inputs give the same bits, and no atomics are used.
#include <cuda_pipeline.h>
#include <mma.h>

#include <climits>
#include <cstring>
#include <string>
#include <type_traits>

#include "cuda/attention.h"
#include "cuda/kernel_util.cuh"
#include "engine/meta_mirror.h"

namespace remat::cuda {

namespace {

using detail::from_f32;
using detail::load_f32;
namespace wmma = nvcuda::wmma;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The exponent domain of a policy. f32 mirrors the CPU kernel (exp of s *
// scale - m); 16-bit policies fold log2(e) into the score multiplier and use
// exp2. lse is stored as a natural log either way.
template <bool kBase2> struct ExpDomain;
template <> struct ExpDomain<false> {
  static float multiplier(float scale) { return scale; }
  __device__ static float ex(float x) { return expf(x); }
  __device__ static float to_lse(float m, float l) { return m + logf(l); }
  __device__ static float from_lse(float lse) { return lse; }
};
template <> struct ExpDomain<true> {
  static float multiplier(float scale) { return scale * kLog2e; }
  __device__ static float ex(float x) { return exp2f(x); }
  __device__ static float to_lse(float m, float l) { return (m + log2f(l)) * kLn2; }
  __device__ static float from_lse(float lse) { return lse * kLog2e; }
};

// ---------------------------------------------------------------------------
// Policies. Shared-memory tiles: operand tiles (Q, K, V, dO) are [rows][kLd]
// Elem; the f32 score tile of the forward is [BM][kLdS]; the backward's P and
// dS are [BM][kLdP] Elem; accumulators are staged as f32 [rows][kLdO].
//
// Products (A [.][kLd] row-major operand tiles unless noted):
//  gemm_nt(C, A, B)          C[BM][BN] = A B^T  (B is [BN][D])
//  gemm2_nt_each(map, A1, B1, A2, B2, fn)
//                            fn(r, c, (A1 B1^T)[r][c], (A2 B2^T)[r][c]) for
//                            every (r, c) of BM x BN, each exactly once
//  Acc<ROWS>: ROWS x D f32 accumulator
//    mma_nn<K>(A, lda, B)    += A B,   A [ROWS][lda] (K cols), B [K][kLd]
//    mma_tn<K>(A, B)         += A^T B, A [K][kLdP] (ROWS cols), B [K][kLd]
//    scale_rows(map, f)      row r *= f[r]
//    store(C)                C[ROWS][kLdO] = acc
// ---------------------------------------------------------------------------

// f32: thread t owns the micro-tile of rows (t / 16) * (ROWS / 8) + [0, ROWS / 8)
// and columns t % 16 + 16 * [0, COLS / 16) of every product.
template <int D_>
struct FmaPolicy {
  using Elem = float;
  static constexpr int D = D_, BM = 32, BN = 32, kThreads = 128;
  static constexpr int kLd = D + 1;  // odd: walking down a column hits distinct banks
  static constexpr int kLdS = BN + 1, kLdP = BN + 1, kLdO = D + 1;
  static constexpr bool kBase2 = false;
  static constexpr bool kVecSmem = false;       // smem rows are not 16-byte aligned
  static constexpr bool kWarpOwnsRows = false;  // score rows cross warps
  static_assert(D % 16 == 0 && BM % 8 == 0 && BN % 16 == 0);

  struct Map {
    __device__ void init(float*) {}
  };

  __device__ static int row0(int rows) { return int(threadIdx.x / 16) * (rows / 8); }
  __device__ static int col0() { return int(threadIdx.x % 16); }

  // This thread's micro-tile of A B^T over the BM x BN tile.
  __device__ static void dot_nt(float (&c)[BM / 8][BN / 16], const float* A, const float* B) {
    constexpr int RM = BM / 8, RN = BN / 16;
    const int r0 = row0(BM), c0 = col0();
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
      for (int j = 0; j < RN; ++j) c[i][j] = 0.0f;
#pragma unroll 4
    for (int kk = 0; kk < D; ++kk) {
      float a[RM], b[RN];
#pragma unroll
      for (int i = 0; i < RM; ++i) a[i] = A[(r0 + i) * kLd + kk];
#pragma unroll
      for (int j = 0; j < RN; ++j) b[j] = B[(c0 + 16 * j) * kLd + kk];
#pragma unroll
      for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int j = 0; j < RN; ++j) c[i][j] = fmaf(a[i], b[j], c[i][j]);
    }
  }

  __device__ static void gemm_nt(float* C, const float* A, const float* B) {
    float c[BM / 8][BN / 16];
    dot_nt(c, A, B);
    const int r0 = row0(BM), c0 = col0();
#pragma unroll
    for (int i = 0; i < BM / 8; ++i)
#pragma unroll
      for (int j = 0; j < BN / 16; ++j) C[(r0 + i) * kLdS + c0 + 16 * j] = c[i][j];
  }

  template <class Fn>
  __device__ static void gemm2_nt_each(const Map&, const float* A1, const float* B1,
                                       const float* A2, const float* B2, Fn&& fn) {
    float s[BM / 8][BN / 16], t[BM / 8][BN / 16];
    dot_nt(s, A1, B1);
    dot_nt(t, A2, B2);
    const int r0 = row0(BM), c0 = col0();
#pragma unroll
    for (int i = 0; i < BM / 8; ++i)
#pragma unroll
      for (int j = 0; j < BN / 16; ++j) fn(r0 + i, c0 + 16 * j, s[i][j], t[i][j]);
  }

  template <int ROWS>
  struct Acc {
    static constexpr int RM = ROWS / 8, RN = D / 16;
    static_assert(ROWS % 8 == 0);
    float c[RM][RN];

    __device__ void zero() {
#pragma unroll
      for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int j = 0; j < RN; ++j) c[i][j] = 0.0f;
    }
    template <int K>
    __device__ void mma_nn(const float* A, int lda, const float* B) {
      const int r0 = row0(ROWS), c0 = col0();
#pragma unroll 4
      for (int kk = 0; kk < K; ++kk) {
        float a[RM], b[RN];
#pragma unroll
        for (int i = 0; i < RM; ++i) a[i] = A[(r0 + i) * lda + kk];
#pragma unroll
        for (int j = 0; j < RN; ++j) b[j] = B[kk * kLd + c0 + 16 * j];
#pragma unroll
        for (int i = 0; i < RM; ++i)
#pragma unroll
          for (int j = 0; j < RN; ++j) c[i][j] = fmaf(a[i], b[j], c[i][j]);
      }
    }
    template <int K>
    __device__ void mma_tn(const float* A, const float* B) {
      const int r0 = row0(ROWS), c0 = col0();
#pragma unroll 4
      for (int kk = 0; kk < K; ++kk) {
        float a[RM], b[RN];
#pragma unroll
        for (int i = 0; i < RM; ++i) a[i] = A[kk * kLdP + r0 + i];
#pragma unroll
        for (int j = 0; j < RN; ++j) b[j] = B[kk * kLd + c0 + 16 * j];
#pragma unroll
        for (int i = 0; i < RM; ++i)
#pragma unroll
          for (int j = 0; j < RN; ++j) c[i][j] = fmaf(a[i], b[j], c[i][j]);
      }
    }
    __device__ void scale_rows(const Map&, const float* f) {
      const int r0 = row0(ROWS);
#pragma unroll
      for (int i = 0; i < RM; ++i) {
        const float s = f[r0 + i];
#pragma unroll
        for (int j = 0; j < RN; ++j) c[i][j] *= s;
      }
    }
    __device__ void store(float* C) const {
      const int r0 = row0(ROWS), c0 = col0();
#pragma unroll
      for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int j = 0; j < RN; ++j) C[(r0 + i) * kLdO + c0 + 16 * j] = c[i][j];
    }
  };
};

// bf16 / f16 on tensor cores: warp w owns rows [16 w, 16 w + 16) of every
// BM-row product and of every accumulator.
template <typename T, int D_>
struct MmaPolicy {
  using Elem = T;
  static constexpr int D = D_, BM = 64, BN = 64, kThreads = 128;
  // Leading dims: multiples of 8 elements (wmma's rule for 16-bit, 16-byte
  // rows) that shift consecutive rows by 4 banks.
  static constexpr int kLd = D + 8, kLdS = BN + 4, kLdP = BN + 8, kLdO = D + 4;
  static constexpr bool kBase2 = true;
  static constexpr bool kVecSmem = true;
  static constexpr bool kWarpOwnsRows = true;
  static_assert(D % 16 == 0 && BM == 16 * (kThreads / 32) && BN % 16 == 0);

  using FragARow = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
  using FragACol = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major>;
  using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
  using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
  using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
  static constexpr int kElems = FragC::num_elements;

  __device__ static int warp() { return int(threadIdx.x / 32); }

  // Row and column (within its 16 x 16 tile) of each element of this lane's
  // accumulator fragments, read back from a fragment loaded from the matrix
  // m[r][c] = 16 r + c. Any FragC has the same layout.
  struct Map {
    int rc[kElems];  // 16 * row + column
    // scratch: 256 floats per warp (32-byte aligned), free to overwrite.
    __device__ void init(float* scratch) {
      float* mine = scratch + 256 * warp();
      for (int e = int(threadIdx.x % 32); e < 256; e += 32) mine[e] = float(e);
      __syncwarp();
      FragC probe;
      wmma::load_matrix_sync(probe, mine, 16, wmma::mem_row_major);
#pragma unroll
      for (int i = 0; i < kElems; ++i) rc[i] = int(probe.x[i]);
      __syncwarp();
    }
    __device__ int row(int i) const { return rc[i] >> 4; }
    __device__ int col(int i) const { return rc[i] & 15; }
  };

  __device__ static void gemm_nt(float* C, const T* A, const T* B) {
    const int w = warp();
    FragC c[BN / 16];
#pragma unroll
    for (int n = 0; n < BN / 16; ++n) wmma::fill_fragment(c[n], 0.0f);
#pragma unroll
    for (int kk = 0; kk < D; kk += 16) {
      FragARow a;
      wmma::load_matrix_sync(a, A + 16 * w * kLd + kk, kLd);
#pragma unroll
      for (int n = 0; n < BN / 16; ++n) {
        FragBCol b;  // B^T(k, n) = B[n][k]
        wmma::load_matrix_sync(b, B + 16 * n * kLd + kk, kLd);
        wmma::mma_sync(c[n], a, b, c[n]);
      }
    }
#pragma unroll
    for (int n = 0; n < BN / 16; ++n)
      wmma::store_matrix_sync(C + 16 * w * kLdS + 16 * n, c[n], kLdS, wmma::mem_row_major);
  }

  template <class Fn>
  __device__ static void gemm2_nt_each(const Map& map, const T* A1, const T* B1, const T* A2,
                                       const T* B2, Fn&& fn) {
    const int w = warp();
#pragma unroll 1
    for (int n = 0; n < BN / 16; ++n) {
      FragC s, t;
      wmma::fill_fragment(s, 0.0f);
      wmma::fill_fragment(t, 0.0f);
#pragma unroll 2
      for (int kk = 0; kk < D; kk += 16) {
        FragARow a;
        FragBCol b;
        wmma::load_matrix_sync(a, A1 + 16 * w * kLd + kk, kLd);
        wmma::load_matrix_sync(b, B1 + 16 * n * kLd + kk, kLd);
        wmma::mma_sync(s, a, b, s);
        wmma::load_matrix_sync(a, A2 + 16 * w * kLd + kk, kLd);
        wmma::load_matrix_sync(b, B2 + 16 * n * kLd + kk, kLd);
        wmma::mma_sync(t, a, b, t);
      }
#pragma unroll
      for (int i = 0; i < kElems; ++i) fn(16 * w + map.row(i), 16 * n + map.col(i), s.x[i], t.x[i]);
    }
  }

  template <int ROWS>
  struct Acc {
    static_assert(ROWS == 16 * (kThreads / 32));
    static constexpr int F = D / 16;
    FragC c[F];

    __device__ void zero() {
#pragma unroll
      for (int f = 0; f < F; ++f) wmma::fill_fragment(c[f], 0.0f);
    }
    template <int K>
    __device__ void mma_nn(const T* A, int lda, const T* B) {
      const int w = warp();
#pragma unroll
      for (int kk = 0; kk < K; kk += 16) {
        FragARow a;
        wmma::load_matrix_sync(a, A + 16 * w * lda + kk, lda);
#pragma unroll
        for (int f = 0; f < F; ++f) {
          FragBRow b;
          wmma::load_matrix_sync(b, B + kk * kLd + 16 * f, kLd);
          wmma::mma_sync(c[f], a, b, c[f]);
        }
      }
    }
    template <int K>
    __device__ void mma_tn(const T* A, const T* B) {
      const int w = warp();
#pragma unroll
      for (int kk = 0; kk < K; kk += 16) {
        FragACol a;  // A^T(m, k) = A[k][m]
        wmma::load_matrix_sync(a, A + kk * kLdP + 16 * w, kLdP);
#pragma unroll
        for (int f = 0; f < F; ++f) {
          FragBRow b;
          wmma::load_matrix_sync(b, B + kk * kLd + 16 * f, kLd);
          wmma::mma_sync(c[f], a, b, c[f]);
        }
      }
    }
    __device__ void scale_rows(const Map& map, const float* f) {
      const float* mine = f + 16 * warp();
      float s[kElems];
#pragma unroll
      for (int i = 0; i < kElems; ++i) s[i] = mine[map.row(i)];
#pragma unroll
      for (int g = 0; g < F; ++g)
#pragma unroll
        for (int i = 0; i < kElems; ++i) c[g].x[i] *= s[i];
    }
    __device__ void store(float* C) const {
      const int w = warp();
#pragma unroll
      for (int f = 0; f < F; ++f)
        wmma::store_matrix_sync(C + 16 * w * kLdO + 16 * f, c[f], kLdO, wmma::mem_row_major);
    }
  };
};

// ---------------------------------------------------------------------------
// Shared-memory layouts (byte offsets, each region 128-byte aligned).

constexpr int round_up(std::size_t bytes) { return int((bytes + 127) / 128 * 128); }

// Forward: Q, two K / V buffers (tile t in buffer t % 2 while t + 1 loads),
// the f32 scores, per-row factors. P (Elem) is written over the scores, row r
// of P starting where row r of S does (leading dim kLdPS).
template <class P>
struct FwdLayout {
  using E = typename P::Elem;
  static constexpr int kTile = round_up(sizeof(E) * P::BN * P::kLd);
  static constexpr int kQ = 0;
  static constexpr int kK0 = kQ + round_up(sizeof(E) * P::BM * P::kLd);
  static constexpr int kV0 = kK0 + kTile;
  static constexpr int kK1 = kV0 + kTile;
  static constexpr int kV1 = kK1 + kTile;
  static constexpr int kS = kV1 + kTile;
  static constexpr int kRow = kS + round_up(sizeof(float) * P::BM * P::kLdS);
  static constexpr int kBytes = kRow + round_up(sizeof(float) * P::BM);
  static constexpr int kLdPS = P::kLdS * int(sizeof(float) / sizeof(E));
  // After the key loop: the f32 output tile over the K / V buffers and S.
  static constexpr int kStage = kK0;
  static_assert(kStage + int(sizeof(float)) * P::BM * P::kLdO <= kRow, "output staging overlaps row stats");
  static_assert(int(sizeof(float)) * 256 * (P::kThreads / 32) <= kRow, "Map scratch does not fit");
  static_assert(int(sizeof(E)) * P::BN <= int(sizeof(float)) * P::kLdS, "a P row must fit in its score row");
};

// Backward: two fixed tiles (K, V for dK / dV; Q, dO for dQ), kStages
// buffers of the two streamed tiles (Q, dO with their lse and delta rows; K,
// V) so that tile t + 1 loads during tile t's math where shared memory allows
// it, then P and dS.
template <class P>
struct BwdLayout {
  using E = typename P::Elem;
  static_assert(P::BM == P::BN, "fixed and streamed tiles share one size");
  // Two stages only where the async copies run and two blocks still fit an SM.
  static constexpr int kStages = P::kVecSmem && P::D <= 64 ? 2 : 1;
  static constexpr int kTile = round_up(sizeof(E) * P::BM * P::kLd);
  static constexpr int kRows = round_up(sizeof(float) * P::BM);
  static constexpr int kFixed = 0;                                     // 2 tiles
  static constexpr int kStream = kFixed + 2 * kTile;                    // kStages x 2 tiles
  static constexpr int kP = kStream + kStages * 2 * kTile;
  static constexpr int kdS = kP + round_up(sizeof(E) * P::BM * P::kLdP);
  static constexpr int kStats = kdS + round_up(sizeof(E) * P::BM * P::kLdP);  // kStages x (lse, delta)
  static constexpr int kBytes = kStats + kStages * 2 * kRows;
  // After the loop: one f32 gradient tile at a time, over everything but the row stats.
  static constexpr int kStage = 0;
  static_assert(kStage + int(sizeof(float)) * P::BM * P::kLdO <= kStats, "gradient staging overlaps row stats");
  static_assert(int(sizeof(float)) * 256 * (P::kThreads / 32) <= kStats, "Map scratch does not fit");

  __device__ static E* fixed(unsigned char* smem, int which) {
    return reinterpret_cast<E*>(smem + kFixed + which * kTile);
  }
  __device__ static E* stream(unsigned char* smem, int stage, int which) {
    return reinterpret_cast<E*>(smem + kStream + (2 * stage + which) * kTile);
  }
  // which 0: lse (in the policy's exponent domain), 1: delta.
  __device__ static float* stats(unsigned char* smem, int stage, int which) {
    return reinterpret_cast<float*>(smem + kStats + (2 * stage + which) * kRows);
  }
};

// ---------------------------------------------------------------------------
// Tile movement between a head's [S, d] rows in global memory and shared memory.

// tile[r][c] = src[row0 + r][c] for r < ROWS, c < D; zero for rows >= S and
// columns >= d. vec: d == D and 16-byte aligned rows (16-byte loads).
template <class P, int ROWS>
__device__ void load_tile(typename P::Elem* tile, const typename P::Elem* src, int row0, int S,
                          int d, bool vec) {
  using E = typename P::Elem;
  if (vec) {
    constexpr int V = 16 / int(sizeof(E)), CH = P::D / V;
    for (int e = int(threadIdx.x); e < ROWS * CH; e += P::kThreads) {
      const int r = e / CH, c = (e % CH) * V, i = row0 + r;
      uint4 x = make_uint4(0u, 0u, 0u, 0u);
      if (i < S) x = *reinterpret_cast<const uint4*>(src + std::int64_t(i) * P::D + c);
      if constexpr (P::kVecSmem) {
        *reinterpret_cast<uint4*>(tile + r * P::kLd + c) = x;
      } else {
        E vals[V];
        memcpy(vals, &x, sizeof x);
#pragma unroll
        for (int u = 0; u < V; ++u) tile[r * P::kLd + c + u] = vals[u];
      }
    }
  } else {
    const E zero = from_f32<E>(0.0f);
    for (int e = int(threadIdx.x); e < ROWS * P::D; e += P::kThreads) {
      const int r = e / P::D, c = e % P::D, i = row0 + r;
      tile[r * P::kLd + c] = (i < S && c < d) ? src[std::int64_t(i) * d + c] : zero;
    }
  }
}

// load_tile, but with 16-byte asynchronous copies (cp.async, complete after
// __pipeline_wait_prior) where the tile rows allow them; zero rows are
// stored directly. Falls back to load_tile (synchronous).
template <class P, int ROWS>
__device__ void fetch_tile(typename P::Elem* tile, const typename P::Elem* src, int row0, int S,
                           int d, bool vec) {
  using E = typename P::Elem;
  if constexpr (P::kVecSmem) {
    if (vec) {
      constexpr int V = 16 / int(sizeof(E)), CH = P::D / V;
      for (int e = int(threadIdx.x); e < ROWS * CH; e += P::kThreads) {
        const int r = e / CH, c = (e % CH) * V, i = row0 + r;
        E* dst = tile + r * P::kLd + c;
        if (i < S) __pipeline_memcpy_async(dst, src + std::int64_t(i) * P::D + c, 16);
        else *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
      }
      return;
    }
  }
  load_tile<P, ROWS>(tile, src, row0, S, d, vec);
}

// dst[row0 + r][c] = stage[r][c] (divided by div[r] when div is set) for rows
// below S and c < d, rounded once to Elem.
template <class P, int ROWS>
__device__ void store_tile(typename P::Elem* dst, const float* stage, int row0, int S, int d,
                           const float* div, bool vec) {
  using E = typename P::Elem;
  if (vec) {
    constexpr int V = 16 / int(sizeof(E)), CH = P::D / V;
    for (int e = int(threadIdx.x); e < ROWS * CH; e += P::kThreads) {
      const int r = e / CH, c = (e % CH) * V, i = row0 + r;
      if (i >= S) continue;
      E vals[V];
#pragma unroll
      for (int u = 0; u < V; ++u) {
        float x = stage[r * P::kLdO + c + u];
        if (div) x = x / div[r];
        vals[u] = from_f32<E>(x);
      }
      uint4 packed;
      memcpy(&packed, vals, sizeof packed);
      *reinterpret_cast<uint4*>(dst + std::int64_t(i) * P::D + c) = packed;
    }
  } else {
    for (int e = int(threadIdx.x); e < ROWS * d; e += P::kThreads) {
      const int r = e / d, c = e % d, i = row0 + r;
      if (i >= S) continue;
      float x = stage[r * P::kLdO + c];
      if (div) x = x / div[r];
      dst[std::int64_t(i) * d + c] = from_f32<E>(x);
    }
  }
}

// Reductions over the G consecutive lanes sharing a row (G divides 32; every
// lane of the warp calls). All G lanes get bit-identical results: each
// butterfly step combines the same two values in either order.
template <int G>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <int G>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---------------------------------------------------------------------------
// Forward. Block b: head b % bh, query tile (last first: under a causal mask
// the late tiles have the most keys).

template <class P>
__global__ void __launch_bounds__(P::kThreads)
    attention_forward_kernel(const typename P::Elem* q, const typename P::Elem* k,
                             const typename P::Elem* v, typename P::Elem* out, float* lse, int bh,
                             int S, int d, bool causal, float score_mul, bool vec) {
  using E = typename P::Elem;
  using L = FwdLayout<P>;
  using X = ExpDomain<P::kBase2>;
  constexpr int BM = P::BM, BN = P::BN;
  constexpr int G = P::kThreads / BM;  // threads per softmax row
  static_assert(G * BM == P::kThreads && 32 % G == 0);
  // Warp-owned rows: the softmax rows of a warp are the rows its products own.
  static_assert(!P::kWarpOwnsRows || G * 16 == 32);

  extern __shared__ __align__(128) unsigned char smem[];
  E* sQ = reinterpret_cast<E*>(smem + L::kQ);
  E* sK[2] = {reinterpret_cast<E*>(smem + L::kK0), reinterpret_cast<E*>(smem + L::kK1)};
  E* sV[2] = {reinterpret_cast<E*>(smem + L::kV0), reinterpret_cast<E*>(smem + L::kV1)};
  float* sS = reinterpret_cast<float*>(smem + L::kS);
  E* sP = reinterpret_cast<E*>(smem + L::kS);
  float* sRow = reinterpret_cast<float*>(smem + L::kRow);
  float* sStage = reinterpret_cast<float*>(smem + L::kStage);

  typename P::Map map;
  map.init(reinterpret_cast<float*>(smem));
  __syncthreads();

  const int tiles = (S + BM - 1) / BM;
  const int head = int(blockIdx.x % unsigned(bh));
  const int i0 = (tiles - 1 - int(blockIdx.x / unsigned(bh))) * BM;
  const std::int64_t base = std::int64_t(head) * S * d;
  const int key_end = causal ? min(S, i0 + BM) : S;
  const int key_tiles = (key_end + BN - 1) / BN;

  fetch_tile<P, BM>(sQ, q + base, i0, S, d, vec);
  fetch_tile<P, BN>(sK[0], k + base, 0, S, d, vec);
  fetch_tile<P, BN>(sV[0], v + base, 0, S, d, vec);
  __pipeline_commit();
  typename P::template Acc<BM> acc;
  acc.zero();

  const int r = int(threadIdx.x) / G, part = int(threadIdx.x) % G, i = i0 + r;
  float m = -INFINITY, l = 0.0f;  // identical in the G threads of row r
  for (int t = 0; t < key_tiles; ++t) {
    const int j0 = t * BN;
    if (t + 1 < key_tiles) {  // into the buffers tile t - 1 used
      fetch_tile<P, BN>(sK[(t + 1) & 1], k + base, j0 + BN, S, d, vec);
      fetch_tile<P, BN>(sV[(t + 1) & 1], v + base, j0 + BN, S, d, vec);
    }
    __pipeline_commit();
    __pipeline_wait_prior(1);  // this thread's copies of tile t (and of Q) have landed
    __syncthreads();           // and everyone's
    P::gemm_nt(sS, sQ, sK[t & 1]);
    if constexpr (P::kWarpOwnsRows) __syncwarp(); else __syncthreads();

    // Online softmax of row r over this tile: columns part, part + G, ...
    constexpr int C = BN / G;
    const float* srow = sS + r * P::kLdS;
    float sv[C];
    float tile_max = -INFINITY;
#pragma unroll
    for (int u = 0; u < C; ++u) {
      const int c = part + G * u, j = j0 + c;
      sv[u] = (j < S && !(causal && j > i)) ? srow[c] * score_mul : -INFINITY;
      tile_max = fmaxf(tile_max, sv[u]);
    }
    tile_max = group_max<G>(tile_max);
    const float m_new = fmaxf(m, tile_max);
    const float m_ref = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet
    const float alpha = X::ex(m - m_ref);                   // 0 while m is -inf
    // Every score of these rows has been read before P overwrites them.
    if constexpr (P::kWarpOwnsRows) __syncwarp(); else __syncthreads();
    E* prow = sP + r * L::kLdPS;
    float sum = 0.0f;
#pragma unroll
    for (int u = 0; u < C; ++u) {
      const float p = X::ex(sv[u] - m_ref);  // masked: exp(-inf) = 0
      prow[part + G * u] = from_f32<E>(p);
      sum += p;
    }
    sum = group_sum<G>(sum);
    l = l * alpha + sum;
    m = m_new;
    if (part == 0) sRow[r] = alpha;
    if constexpr (P::kWarpOwnsRows) __syncwarp(); else __syncthreads();

    acc.scale_rows(map, sRow);
    acc.template mma_nn<BN>(sP, L::kLdPS, sV[t & 1]);
    __syncthreads();  // tile t's K / V buffers, the scores and sRow are free again
  }
  if (part == 0) sRow[r] = l;
  acc.store(sStage);
  __syncthreads();
  store_tile<P, BM>(out + base, sStage, i0, S, d, sRow, vec);
  if (part == 0 && i < S) lse[std::int64_t(head) * S + i] = X::to_lse(m, l);
}

// ---------------------------------------------------------------------------
// Backward.

// delta[row] = sum_c dout[row][c] * out[row][c] in f32, one warp per row.
template <typename T>
__global__ void attention_delta_kernel(const T* out, const T* dout, float* delta, std::int64_t rows,
                                       int d) {
  const int lane = int(threadIdx.x % 32);
  const std::int64_t warps = std::int64_t(blockDim.x / 32);
  for (std::int64_t row = std::int64_t(blockIdx.x) * warps + threadIdx.x / 32; row < rows;
       row += std::int64_t(gridDim.x) * warps) {
    const T* o = out + row * d;
    const T* g = dout + row * d;
    float acc = 0.0f;
    for (int c = lane; c < d; c += 32) acc = fmaf(load_f32(g + c), load_f32(o + c), acc);
    acc = detail::warp_sum(acc);
    if (lane == 0) delta[row] = acc;
  }
}

// sLse / sDelta for query rows [i0, i0 + BM) (zero past S).
template <class P, bool kBase2>
__device__ void load_row_stats(float* sLse, float* sDelta, const float* lse, const float* delta,
                               int i0, int S) {
  for (int r = int(threadIdx.x); r < P::BM; r += P::kThreads) {
    const int i = i0 + r;
    sLse[r] = i < S ? ExpDomain<kBase2>::from_lse(lse[i]) : 0.0f;
    sDelta[r] = i < S ? delta[i] : 0.0f;
  }
}

// dK and dV of key tile j0 (block b: head b % bh, key tile b / bh, the early
// tiles first: under a causal mask they meet the most queries). Query tiles
// are visited in increasing order, from the first that reaches j0.
template <class P>
__global__ void __launch_bounds__(P::kThreads)
    attention_dkdv_kernel(const typename P::Elem* q, const typename P::Elem* k,
                          const typename P::Elem* v, const typename P::Elem* dout,
                          const float* lse, const float* delta, typename P::Elem* dk,
                          typename P::Elem* dv, int bh, int S, int d, bool causal,
                          float score_mul, float scale, bool vec) {
  using E = typename P::Elem;
  using L = BwdLayout<P>;
  using X = ExpDomain<P::kBase2>;
  constexpr int BM = P::BM, BN = P::BN;

  extern __shared__ __align__(128) unsigned char smem[];
  E* sK = L::fixed(smem, 0);
  E* sV = L::fixed(smem, 1);
  E* sP = reinterpret_cast<E*>(smem + L::kP);
  E* sdS = reinterpret_cast<E*>(smem + L::kdS);
  float* sStage = reinterpret_cast<float*>(smem + L::kStage);

  typename P::Map map;
  map.init(reinterpret_cast<float*>(smem));
  __syncthreads();

  const int head = int(blockIdx.x % unsigned(bh));
  const int j0 = int(blockIdx.x / unsigned(bh)) * BN;
  const std::int64_t base = std::int64_t(head) * S * d;
  const float* hlse = lse + std::int64_t(head) * S;
  const float* hdelta = delta + std::int64_t(head) * S;
  const int first = causal ? j0 / BM * BM : 0;
  const int query_tiles = (S - first + BM - 1) / BM;
  // Query tile t (rows from first + t * BM) into stage t % kStages.
  auto fetch = [&](int t) {
    const int st = t % L::kStages, i0 = first + t * BM;
    fetch_tile<P, BM>(L::stream(smem, st, 0), q + base, i0, S, d, vec);
    fetch_tile<P, BM>(L::stream(smem, st, 1), dout + base, i0, S, d, vec);
    load_row_stats<P, P::kBase2>(L::stats(smem, st, 0), L::stats(smem, st, 1), hlse, hdelta, i0, S);
  };

  fetch_tile<P, BN>(sK, k + base, j0, S, d, vec);
  fetch_tile<P, BN>(sV, v + base, j0, S, d, vec);
  fetch(0);
  __pipeline_commit();
  typename P::template Acc<BN> acc_k, acc_v;
  acc_k.zero();
  acc_v.zero();

  for (int t = 0; t < query_tiles; ++t) {
    const int st = t % L::kStages, i0 = first + t * BM;
    if (L::kStages == 2 && t + 1 < query_tiles) fetch(t + 1);  // into the stage tile t - 1 used
    __pipeline_commit();
    __pipeline_wait_prior(L::kStages - 1);  // this thread's copies of tile t have landed
    __syncthreads();                        // and everyone's
    const E* sQ = L::stream(smem, st, 0);
    const E* sdO = L::stream(smem, st, 1);
    const float* sLse = L::stats(smem, st, 0);
    const float* sDelta = L::stats(smem, st, 1);
    // S = Q K^T and dP = dO V^T, element by element into P and dS.
    P::gemm2_nt_each(map, sQ, sK, sdO, sV, [&](int r, int c, float s, float dp) {
      const int i = i0 + r, j = j0 + c;
      float p = 0.0f, ds = 0.0f;
      if (i < S && j < S && !(causal && j > i)) {
        p = X::ex(s * score_mul - sLse[r]);
        ds = scale * (p * (dp - sDelta[r]));
      }
      sP[r * P::kLdP + c] = from_f32<E>(p);
      sdS[r * P::kLdP + c] = from_f32<E>(ds);
    });
    __syncthreads();
    acc_v.template mma_tn<BM>(sP, sdO);  // dV += P^T dO
    acc_k.template mma_tn<BM>(sdS, sQ);  // dK += dS^T Q
    __syncthreads();  // stage st, P and dS are free again
    if (L::kStages == 1 && t + 1 < query_tiles) fetch(t + 1);
  }
  if (dv) {
    acc_v.store(sStage);
    __syncthreads();
    store_tile<P, BN>(dv + base, sStage, j0, S, d, nullptr, vec);
    __syncthreads();
  }
  if (dk) {
    acc_k.store(sStage);
    __syncthreads();
    store_tile<P, BN>(dk + base, sStage, j0, S, d, nullptr, vec);
  }
}

// dQ of query tile i0 (block b: head b % bh, query tile last first). Key
// tiles are visited in increasing order, up to the last the causal mask reaches.
template <class P>
__global__ void __launch_bounds__(P::kThreads)
    attention_dq_kernel(const typename P::Elem* q, const typename P::Elem* k,
                        const typename P::Elem* v, const typename P::Elem* dout, const float* lse,
                        const float* delta, typename P::Elem* dq, int bh, int S, int d,
                        bool causal, float score_mul, float scale, bool vec) {
  using E = typename P::Elem;
  using L = BwdLayout<P>;
  using X = ExpDomain<P::kBase2>;
  constexpr int BM = P::BM, BN = P::BN;

  extern __shared__ __align__(128) unsigned char smem[];
  E* sQ = L::fixed(smem, 0);
  E* sdO = L::fixed(smem, 1);
  E* sdS = reinterpret_cast<E*>(smem + L::kdS);
  float* sLse = L::stats(smem, 0, 0);
  float* sDelta = L::stats(smem, 0, 1);
  float* sStage = reinterpret_cast<float*>(smem + L::kStage);

  typename P::Map map;
  map.init(reinterpret_cast<float*>(smem));
  __syncthreads();

  const int tiles = (S + BM - 1) / BM;
  const int head = int(blockIdx.x % unsigned(bh));
  const int i0 = (tiles - 1 - int(blockIdx.x / unsigned(bh))) * BM;
  const std::int64_t base = std::int64_t(head) * S * d;
  const int key_end = causal ? min(S, i0 + BM) : S;
  const int key_tiles = (key_end + BN - 1) / BN;
  // Key tile t into stage t % kStages.
  auto fetch = [&](int t) {
    const int st = t % L::kStages;
    fetch_tile<P, BN>(L::stream(smem, st, 0), k + base, t * BN, S, d, vec);
    fetch_tile<P, BN>(L::stream(smem, st, 1), v + base, t * BN, S, d, vec);
  };

  fetch_tile<P, BM>(sQ, q + base, i0, S, d, vec);
  fetch_tile<P, BM>(sdO, dout + base, i0, S, d, vec);
  load_row_stats<P, P::kBase2>(sLse, sDelta, lse + std::int64_t(head) * S,
                               delta + std::int64_t(head) * S, i0, S);
  fetch(0);
  __pipeline_commit();
  typename P::template Acc<BM> acc;
  acc.zero();

  for (int t = 0; t < key_tiles; ++t) {
    const int st = t % L::kStages, j0 = t * BN;
    if (L::kStages == 2 && t + 1 < key_tiles) fetch(t + 1);  // into the stage tile t - 1 used
    __pipeline_commit();
    __pipeline_wait_prior(L::kStages - 1);  // this thread's copies of tile t have landed
    __syncthreads();                        // and everyone's
    const E* sK = L::stream(smem, st, 0);
    const E* sV = L::stream(smem, st, 1);
    P::gemm2_nt_each(map, sQ, sK, sdO, sV, [&](int r, int c, float s, float dp) {
      const int i = i0 + r, j = j0 + c;
      float ds = 0.0f;
      if (i < S && j < S && !(causal && j > i)) {
        const float p = X::ex(s * score_mul - sLse[r]);
        ds = scale * (p * (dp - sDelta[r]));
      }
      sdS[r * P::kLdP + c] = from_f32<E>(ds);
    });
    __syncthreads();
    acc.template mma_nn<BN>(sdS, P::kLdP, sK);  // dQ += dS K
    __syncthreads();  // stage st and dS are free again
    if (L::kStages == 1 && t + 1 < key_tiles) fetch(t + 1);
  }
  acc.store(sStage);
  __syncthreads();
  store_tile<P, BM>(dq + base, sStage, i0, S, d, nullptr, vec);
}

// ---------------------------------------------------------------------------
// Host side.

// Calls fn(policy) with the policy for dtype and head dim d (padded up to 16,
// 32, 64 or 128).
template <typename Fn>
void with_policy(DType dtype, std::int64_t d, const char* what, Fn&& fn) {
  detail::dispatch_floating(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    auto pick = [&](auto dim) {
      constexpr int D = decltype(dim)::value;
      if constexpr (std::is_same_v<T, float>) fn(FmaPolicy<D>{});
      else fn(MmaPolicy<T, D>{});
    };
    if (d <= 16) pick(std::integral_constant<int, 16>{});
    else if (d <= 32) pick(std::integral_constant<int, 32>{});
    else if (d <= 64) pick(std::integral_constant<int, 64>{});
    else pick(std::integral_constant<int, 128>{});
  });
}

void check_sizes(const char* what, std::int64_t bh, std::int64_t s, std::int64_t d) {
  if (d < 1 || d > kAttentionMaxHeadDim)
    throw ShapeError(std::string(what) + ": head dim must be in [1, " +
                     std::to_string(kAttentionMaxHeadDim) + "] on CUDA, got " + std::to_string(d));
  if (bh < 0 || s < 0 || s > INT_MAX / 2 || bh > INT_MAX ||
      bh * ((s + 31) / 32) > std::int64_t(INT_MAX))
    throw ShapeError(std::string(what) + ": too many rows for the CUDA kernel (B*H " +
                     std::to_string(bh) + ", S " + std::to_string(s) + ")");
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

template <typename Kernel>
void allow_shared_memory(Kernel* kernel, int bytes) {
  detail::check_cuda(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
      "cudaFuncSetAttribute (attention shared memory)");
}

}  // namespace

void attention_forward(const void* q, const void* k, const void* v, void* out, float* lse,
                       std::int64_t bh, std::int64_t s, std::int64_t d, bool causal, float scale,
                       DType dtype, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  check_sizes("attention_forward", bh, s, d);
  if (bh == 0 || s == 0) return;
  with_policy(dtype, d, "attention_forward", [&](auto policy) {
    using P = decltype(policy);
    using E = typename P::Elem;
    const bool vec = d == P::D && aligned16(q) && aligned16(k) && aligned16(v) && aligned16(out);
    const int bytes = FwdLayout<P>::kBytes;
    allow_shared_memory(attention_forward_kernel<P>, bytes);
    const unsigned blocks = unsigned(bh * ((s + P::BM - 1) / P::BM));
    attention_forward_kernel<P><<<blocks, P::kThreads, bytes, detail::as_stream(stream)>>>(
        static_cast<const E*>(q), static_cast<const E*>(k), static_cast<const E*>(v),
        static_cast<E*>(out), lse, int(bh), int(s), int(d), causal,
        ExpDomain<P::kBase2>::multiplier(scale), vec);
  });
  detail::check_launch("attention_forward");
}

void attention_backward(const void* q, const void* k, const void* v, const void* out,
                        const void* dout, const float* lse, void* dq, void* dk, void* dv,
                        float* delta, std::int64_t bh, std::int64_t s, std::int64_t d, bool causal,
                        float scale, DType dtype, StreamId stream) {
  if (meta_addresses_active()) return;  // a meta run of this code launches nothing
  check_sizes("attention_backward", bh, s, d);
  if (bh == 0 || s == 0 || (!dq && !dk && !dv)) return;
  with_policy(dtype, d, "attention_backward", [&](auto policy) {
    using P = decltype(policy);
    using E = typename P::Elem;
    const cudaStream_t st = detail::as_stream(stream);
    const std::int64_t rows = bh * s;
    attention_delta_kernel<E><<<detail::blocks_for(rows, 8), 256, 0, st>>>(
        static_cast<const E*>(out), static_cast<const E*>(dout), delta, rows, int(d));
    detail::check_launch("attention_backward (delta)");

    const bool vec = d == P::D && aligned16(q) && aligned16(k) && aligned16(v) &&
                     aligned16(dout) && aligned16(dq) && aligned16(dk) && aligned16(dv);
    const float score_mul = ExpDomain<P::kBase2>::multiplier(scale);
    const int bytes = BwdLayout<P>::kBytes;
    if (dk || dv) {
      allow_shared_memory(attention_dkdv_kernel<P>, bytes);
      const unsigned blocks = unsigned(bh * ((s + P::BN - 1) / P::BN));
      attention_dkdv_kernel<P><<<blocks, P::kThreads, bytes, st>>>(
          static_cast<const E*>(q), static_cast<const E*>(k), static_cast<const E*>(v),
          static_cast<const E*>(dout), lse, delta, static_cast<E*>(dk), static_cast<E*>(dv),
          int(bh), int(s), int(d), causal, score_mul, scale, vec);
      detail::check_launch("attention_backward (dk, dv)");
    }
    if (dq) {
      allow_shared_memory(attention_dq_kernel<P>, bytes);
      const unsigned blocks = unsigned(bh * ((s + P::BM - 1) / P::BM));
      attention_dq_kernel<P><<<blocks, P::kThreads, bytes, st>>>(
          static_cast<const E*>(q), static_cast<const E*>(k), static_cast<const E*>(v),
          static_cast<const E*>(dout), lse, delta, static_cast<E*>(dq), int(bh), int(s), int(d),
          causal, score_mul, scale, vec);
      detail::check_launch("attention_backward (dq)");
    }
  });
}

}  // namespace remat::cuda
