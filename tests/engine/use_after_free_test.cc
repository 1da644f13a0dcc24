// A write or read through a dangling pointer into a freed tensor's storage
// is reported by ASan: the CPU caching allocator poisons blocks in its cache
// (engine/memory_poison.h). Each case runs tests/engine/use_after_free_probe
// as a child and reads its report. [asan]: skipped unless built with ASan
// (./remat test --asan).
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

namespace {

struct ProbeRun {
  int exit_code = -1;  // -1: did not exit normally
  std::string output;  // stdout and stderr
};

// The probe binary, built beside this test (its data dependency).
std::string probe_path() {
  std::array<char, 4096> buf{};
  const ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  REQUIRE(n > 0);
  return (std::filesystem::path(std::string(buf.data(), std::size_t(n))).parent_path() /
          "use_after_free_probe")
      .string();
}

// Runs the probe in `mode` and collects what it printed and how it ended.
ProbeRun run_probe(const std::string& mode) {
  const std::string cmd = "'" + probe_path() + "' " + mode + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  ProbeRun run;
  std::array<char, 4096> chunk{};
  while (std::size_t n = std::fread(chunk.data(), 1, chunk.size(), pipe))
    run.output.append(chunk.data(), n);
  const int status = pclose(pipe);
  if (status != -1 && WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  return run;
}

// The report must name the access, the poisoning and the caching allocator
// that owns the block (the stack that reserved its segment).
void check_report(const ProbeRun& run, const std::string& access) {
  INFO(run.output);
  CHECK(run.exit_code != 0);
  CHECK(run.exit_code != -1);  // ASan exits; a signal would be another failure
  CHECK_THAT(run.output, Catch::Contains("ERROR: AddressSanitizer: use-after-poison"));
  CHECK_THAT(run.output, Catch::Contains(access + " of size 4"));
  CHECK_THAT(run.output, Catch::Contains("remat::CachingAllocator::reserve_segment"));
  CHECK_THAT(run.output, Catch::Contains("remat::CachingAllocator::allocate"));
  CHECK_THAT(run.output, Catch::Contains("use_after_free_probe.cc"));
  CHECK_THAT(run.output, !Catch::Contains("probe: survived"));
}

}  // namespace

TEST_CASE("the probe survives a write through a live tensor's pointer", "[asan]") {
  const ProbeRun run = run_probe("live");
  INFO(run.output);
  CHECK(run.exit_code == 0);
  CHECK_THAT(run.output, Catch::Contains("probe: survived (live, read 0)"));
  CHECK_THAT(run.output, !Catch::Contains("AddressSanitizer"));
}

TEST_CASE("ASan reports a write through a dangling pointer into a cached block", "[asan]") {
  check_report(run_probe("write"), "WRITE");
}

TEST_CASE("ASan reports a read through a dangling pointer into a cached block", "[asan]") {
  check_report(run_probe("read"), "READ");
}
