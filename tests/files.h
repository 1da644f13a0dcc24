// Files for tests: scratch folders removed when the test binary exits, and
// whole-file reads and writes that fail the test (not throw) on error.
#pragma once

#include <catch2/catch.hpp>

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace remat::test {

// A fresh folder /tmp/remat-<tag>-XXXXXX, removed when the test binary exits.
inline std::string temp_dir(const std::string& tag) {
  static struct Cleanup {
    std::vector<std::string> dirs;
    ~Cleanup() {
      for (const auto& d : dirs) std::filesystem::remove_all(d);
    }
  } cleanup;
  std::string tmpl = "/tmp/remat-" + tag + "-XXXXXX";
  REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
  cleanup.dirs.push_back(tmpl);
  return tmpl;
}

// The whole file at `path` (which must exist).
inline std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// Replaces the file at `path` with `bytes`.
inline void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  REQUIRE(out.good());
}

}  // namespace remat::test
