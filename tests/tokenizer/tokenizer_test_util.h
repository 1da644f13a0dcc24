// Helpers the tokenizer tests share (scratch folders and file reads/writes
// are tests/files.h): the test data folder, base64, and loading a reference tokenizer
// once per binary.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tests/files.h"
#include "tokenizer/tokenizer.h"

namespace remat::test {

// tests/tokenizer/data: in Bazel's runfiles under `bazel test`, else from the
// repository root (where tools/run_tests.sh runs the binaries).
inline std::string data_dir() {
  namespace fs = std::filesystem;
  if (const char* runfiles = ::getenv("TEST_SRCDIR")) {
    const fs::path p = fs::path(runfiles) / "remat" / "tests" / "tokenizer" / "data";
    if (fs::is_directory(p)) return p.string();
  }
  const fs::path p = fs::path("tests") / "tokenizer" / "data";
  REQUIRE(fs::is_directory(p));
  return p.string();
}

inline std::string base64_decode(const std::string& text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  std::uint32_t bits = 0;
  int count = 0;
  for (char c : text) {
    const int v = value(c);
    if (v < 0) continue;  // padding
    bits = (bits << 6) | static_cast<std::uint32_t>(v);
    count += 6;
    if (count >= 8) {
      count -= 8;
      out.push_back(static_cast<char>((bits >> count) & 0xFF));
    }
  }
  return out;
}

// FNV-1a 32 over the ids' little-endian int32 bytes (as make_fixtures.js).
inline std::uint32_t fnv1a32(const std::vector<std::int32_t>& ids) {
  std::uint32_t h = 2166136261u;
  for (std::int32_t id : ids)
    for (int k = 0; k < 4; ++k) {
      h ^= (static_cast<std::uint32_t>(id) >> (8 * k)) & 0xFF;
      h *= 16777619u;
    }
  return h;
}

// The reference tokenizer tests/tokenizer/data/<name>, loaded once.
inline const Tokenizer& reference_tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  auto& slot = loaded[name];
  if (!slot) slot = load_tokenizer(data_dir() + "/" + name);
  return *slot;
}

}  // namespace remat::test
