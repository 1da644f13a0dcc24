// The instruction set of the CPU kernels that are compiled for more than one
// (today the attention tiles of ops/attention.cc): AVX-512 where the CPU has
// it, else AVX2 + FMA, the build's baseline (.bazelrc). Those kernels compute
// the same sums in the same order on either path, so the choice changes speed
// only. Internal to ops/.
#pragma once

namespace remat::ops_detail {

enum class Simd { avx2, avx512 };

// "avx2" or "avx512".
const char* simd_name(Simd s);

// True if this CPU (and OS) runs the AVX-512 kernels (AVX-512F).
bool cpu_has_avx512();

// The path the kernels take. Chosen once, at the first call: REMAT_SIMD=avx2
// forces AVX2; REMAT_SIMD=avx512 asks for AVX-512 and throws Error on a CPU
// without it; unset, empty or "auto" picks AVX-512 where the CPU has it.
// Any other value throws Error naming the valid ones.
Simd simd_path();

// Sets the path for the rest of the process (tests run both and compare);
// throws Error for avx512 on a CPU without it.
void set_simd_path(Simd s);

}  // namespace remat::ops_detail
