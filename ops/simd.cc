#include "ops/simd.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "engine/error.h"

namespace remat::ops_detail {

namespace {

Simd best_available() { return cpu_has_avx512() ? Simd::avx512 : Simd::avx2; }

void check_supported(Simd s, const char* who) {
  REMAT_CHECK(s != Simd::avx512 || cpu_has_avx512(), Error, who,
              ": the AVX-512 kernels were asked for, but this CPU has no AVX-512F");
}

Simd initial_path() {
  const char* env = std::getenv("REMAT_SIMD");
  const std::string v = env ? env : "";
  if (v.empty() || v == "auto") return best_available();
  if (v == "avx2") return Simd::avx2;
  REMAT_CHECK(v == "avx512", Error, "REMAT_SIMD must be avx2, avx512 or auto, got '", v, "'");
  check_supported(Simd::avx512, "REMAT_SIMD=avx512");
  return Simd::avx512;
}

std::atomic<Simd>& path_slot() {
  static std::atomic<Simd> path{initial_path()};
  return path;
}

}  // namespace

const char* simd_name(Simd s) { return s == Simd::avx512 ? "avx512" : "avx2"; }

bool cpu_has_avx512() {
  // libgcc's check includes the OS saving the AVX-512 registers (XGETBV).
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return has;
}

Simd simd_path() { return path_slot().load(std::memory_order_relaxed); }

void set_simd_path(Simd s) {
  check_supported(s, "set_simd_path");
  path_slot().store(s, std::memory_order_relaxed);
}

}  // namespace remat::ops_detail
