// How a fuzz target (targets.h) reports an accepted input that broke its
// invariant: a message on stderr, then abort(), which libFuzzer and a test
// run both notice.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace remat::fuzz {

// Prints "fuzz target TARGET: invariant broken: WHAT" and aborts.
[[noreturn]] inline void broken(const char* target, const std::string& what) {
  std::fprintf(stderr, "fuzz target %s: invariant broken: %s\n", target, what.c_str());
  std::abort();
}

}  // namespace remat::fuzz
