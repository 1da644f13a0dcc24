// What the library does around a collective of several ranks on its own:
// it counts it and names it while in flight, calls the hooks a program
// installed, and nothing else (no signal handler, no watchdog thread that
// could end the process, no environment read). The remat tool's opt-in
// handling is tested in tests/tools/comm_watchdog_test.cc.
#include <signal.h>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "engine/tensor.h"
#include "parallel/process_group.h"
#include "tests/parallel/fake_group.h"

using namespace remat;

namespace {

// SIGTERM's handler now (Catch2 installs its own while tests run).
void (*sigterm_handler())(int) {
  struct sigaction now;
  sigaction(SIGTERM, nullptr, &now);
  return now.sa_handler;
}

std::vector<std::int64_t> g_counted;
std::vector<std::string> g_blocked_in;
void record_count(std::int64_t n) { g_counted.push_back(n); }
void record_block() { g_blocked_in.emplace_back(collective_in_flight() ? collective_in_flight() : "(none)"); }

}  // namespace

TEST_CASE("the comm timeout defaults to 300 s and is not read from the environment", "[parallel]") {
  ::setenv("REMAT_COMM_TIMEOUT", "7", 1);
  CHECK(comm_timeout() == 300);
  set_comm_timeout(12.5);
  CHECK(comm_timeout() == 12.5);
  set_comm_timeout(300);
  ::unsetenv("REMAT_COMM_TIMEOUT");
}

TEST_CASE("a collective of several ranks installs no signal handler on its own", "[parallel]") {
  const auto before = sigterm_handler();
  testing::TwoRankFakeGroup g;
  const char* seen = nullptr;
  double seconds = -2;
  g.during = [&] {
    seen = collective_in_flight();
    seconds = collective_in_flight_seconds();
  };
  Tensor t = zeros({4});
  g.all_reduce(t, ReduceOp::sum);
  REQUIRE(seen != nullptr);
  CHECK(std::string(seen) == "collective all_reduce (phase forward, 16 bytes, rank 0 of 2)");
  CHECK(seconds >= 0);
  // Done: nothing in flight, and SIGTERM is handled as before.
  CHECK(collective_in_flight() == nullptr);
  CHECK(collective_in_flight_seconds() < 0);
  CHECK(sigterm_handler() == before);
  CHECK(g.counters().calls_of(CollectiveKind::all_reduce, CommPhase::forward) == 1);
}

TEST_CASE("installed hooks see every counted collective and every block", "[parallel]") {
  set_collective_hooks({record_count, record_block});
  testing::TwoRankFakeGroup g;
  Tensor t = zeros({2, 3});
  g.broadcast(t, 0);
  g.all_gather(t);
  g.barrier();  // blocks, but is not counted
  set_collective_hooks({});
  g.broadcast(t, 0);  // no hooks any more
  REQUIRE(g_counted.size() == 2);
  CHECK(g_counted[1] == g_counted[0] + 1);
  CHECK(g_blocked_in == std::vector<std::string>{"collective broadcast (phase forward, 24 bytes, rank 0 of 2)",
                                                 "collective all_gather (phase forward, 24 bytes, rank 0 of 2)",
                                                 "collective barrier (phase forward, 0 bytes, rank 0 of 2)"});
  // A group of one process is not watched.
  set_collective_hooks({record_count, record_block});
  Tensor u = zeros({1});
  single_process_group()->all_reduce(u, ReduceOp::sum);
  set_collective_hooks({});
  CHECK(g_counted.size() == 2);
  CHECK(g_blocked_in.size() == 3);
}
