// The Catch2 main shared by every remat test binary. Besides Catch2's own
// report it prints one summary line that ./remat test adds up:
//
//   remat-tests: N passed, M failed, K skipped
//
// counting test cases. Tests tagged [cuda] need a GPU, tests tagged [asan] a
// build with AddressSanitizer (./remat test --asan); without it they are
// excluded from the run and counted (and listed) as skipped. A case that
// finds at run time that it cannot run here calls REMAT_SKIP (tests/skip.h)
// and is counted and listed as skipped too.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/device_runtime.h"
#include "engine/memory_poison.h"
#include "tests/skip.h"

namespace {

int g_passed = 0;
int g_failed = 0;
int g_skipped_at_run_time = 0;
thread_local std::string g_skip_reason;  // set by mark_skipped during the running case (Catch2 runs cases on one thread)

struct CountingListener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(Catch::TestCaseInfo const&) override { g_skip_reason.clear(); }
  void testCaseEnded(Catch::TestCaseStats const& stats) override {
    if (stats.totals.assertions.failed > 0) {
      ++g_failed;
    } else if (!g_skip_reason.empty()) {
      ++g_skipped_at_run_time;
      std::printf("skipped (%s): %s\n", g_skip_reason.c_str(), stats.testInfo.name.c_str());
    } else {
      ++g_passed;
    }
  }
};

bool has_tag(const Catch::TestCase& tc, const std::string& tag) {
  const auto& tags = tc.getTestCaseInfo().tags;
  return std::find(tags.begin(), tags.end(), tag) != tags.end();
}

// Leaves the test cases tagged `tag` out of the run, printing each as
// "skipped (`why`): NAME"; returns how many there were.
int skip_tagged(Catch::Session& session, const std::string& tag, const char* why) {
  std::vector<std::string> names;
  for (const auto& tc : Catch::getAllTestCasesSorted(session.config()))
    if (has_tag(tc, tag)) names.push_back(tc.getTestCaseInfo().name);
  if (names.empty()) return 0;
  auto& data = session.configData();
  if (data.testsOrTags.empty()) data.testsOrTags.push_back("~[" + tag + "]");
  else data.testsOrTags.back() += " ~[" + tag + "]";
  session.useConfigData(data);
  for (const auto& n : names) std::printf("skipped (%s): %s\n", why, n.c_str());
  return int(names.size());
}

}  // namespace

void remat::test::mark_skipped(const std::string& reason) { g_skip_reason = reason.empty() ? "skipped" : reason; }

CATCH_REGISTER_LISTENER(CountingListener)

int main(int argc, char** argv) {
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;

  int skipped = 0;
  if (remat::cuda_device_count() == 0) skipped += skip_tagged(session, "cuda", "no CUDA device");
  if (!remat::detail::kAsanBuild) skipped += skip_tagged(session, "asan", "needs --asan");

  // Everything skipped: Catch2 would call an empty run a failure.
  const auto& all = Catch::getAllTestCasesSorted(session.config());
  if (skipped > 0 && std::size_t(skipped) == all.size()) {
    std::printf("remat-tests: 0 passed, 0 failed, %d skipped\n", skipped);
    return 0;
  }
  const int rc = session.run();
  std::printf("remat-tests: %d passed, %d failed, %d skipped\n", g_passed, g_failed, skipped + g_skipped_at_run_time);
  std::fflush(stdout);
  return rc != 0 || g_failed != 0 ? 1 : 0;
}
