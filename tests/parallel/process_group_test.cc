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

TEST_CASE("a send or receive is counted when started and named while waited for", "[parallel][p2p]") {
  set_collective_hooks({record_count, record_block});
  g_counted.clear();
  g_blocked_in.clear();
  testing::TwoRankFakeGroup g;
  Tensor t = zeros({1024});  // 4096 bytes
  auto s = g.isend(t, 1, 3);
  std::shared_ptr<CommWork> r;
  {
    CommPhaseScope backward(CommPhase::backward);
    r = g.irecv(t, 1, 4);
  }
  CHECK(g_counted.size() == 2);  // counted when started
  CHECK(g_blocked_in.empty());   // nothing waited for yet
  s->wait();
  r->wait();  // in forward now, but started in backward
  g.recv(t, 1, 0);
  set_collective_hooks({});
  CHECK(g_counted.size() == 3);
  CHECK(g_blocked_in == std::vector<std::string>{
                            "send to rank 1 (tag 3, phase forward, 4096 bytes, rank 0 of 2)",
                            "recv from rank 1 (tag 4, phase backward, 4096 bytes, rank 0 of 2)",
                            "recv from rank 1 (tag 0, phase forward, 4096 bytes, rank 0 of 2)"});
  CHECK(collective_in_flight() == nullptr);
  const CommCounters c = g.counters();
  CHECK(c.calls_of(CollectiveKind::send, CommPhase::forward) == 1);
  CHECK(c.bytes_of(CollectiveKind::send, CommPhase::forward) == 4096);
  CHECK(c.calls_of(CollectiveKind::recv, CommPhase::backward) == 1);
  CHECK(c.calls_of(CollectiveKind::recv, CommPhase::forward) == 1);
  CHECK(c.bytes_in(CommPhase::forward) == 8192);
}

TEST_CASE("every back end refuses the same bad sends and receives, naming the op and the ranks", "[parallel][p2p]") {
  testing::TwoRankFakeGroup g;
  Tensor t = zeros({2, 3});
  CHECK_THROWS_WITH(g.isend(t, 2, 0), Catch::Contains("send to rank 2 (tag 0, rank 0 of 2): no such rank; the "
                                                      "destination must be another rank of this group, 0 to 1"));
  CHECK_THROWS_WITH(g.irecv(t, -1, 0), Catch::Contains("recv from rank -1 (tag 0, rank 0 of 2): no such rank; the "
                                                       "source must be another rank of this group, 0 to 1"));
  CHECK_THROWS_WITH(g.send(t, 0, 1), Catch::Contains("send to rank 0 (tag 1, rank 0 of 2): a rank cannot send to "
                                                     "itself"));
  CHECK_THROWS_WITH(g.recv(t, 1, -1), Catch::Contains("recv from rank 1 (tag -1, rank 0 of 2): the tag must be >= 0"));
  Tensor view = t.transpose(0, 1);
  CHECK_THROWS_WITH(g.isend(view, 1, 0), Catch::Contains("send to rank 1 (tag 0, rank 0 of 2): the tensor must be "
                                                         "contiguous, got sizes [3, 2] with strides [1, 3]"));
  Tensor undefined;
  CHECK_THROWS_WITH(g.irecv(undefined, 1, 0), Catch::Contains("the tensor is undefined"));
  CHECK(g.counters().calls_in(CommPhase::forward) == 0);
}
