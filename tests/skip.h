// Skipping a test case at run time: a case that cannot run here (one process
// where it needs several ranks) says so and is counted as skipped, not
// passed, in the summary line of tests/main.cc.
#pragma once

#include <string>

namespace remat::test {

// Marks the running test case as skipped, with the reason the summary lists.
// The case should return right after (REMAT_SKIP does both).
void mark_skipped(const std::string& reason);

}  // namespace remat::test

// Skips the running test case: marks it and returns from it.
#define REMAT_SKIP(reason)                  \
  do {                                      \
    ::remat::test::mark_skipped(reason);    \
    return;                                 \
  } while (0)
