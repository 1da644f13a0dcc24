// The libFuzzer entry point of one target of targets.h, chosen when compiling
// by REMAT_FUZZ_TARGET (tests/fuzz/BUILD makes one binary per target).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tests/fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  (void)remat::fuzz::REMAT_FUZZ_TARGET(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
