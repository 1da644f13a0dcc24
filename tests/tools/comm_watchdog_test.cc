// The remat tool's opt-in handling of failed peers (tools/comm_watchdog.h):
// each case runs in a forked child (a fresh process: nothing installed, no
// collective run yet) and checks how the child ends and what it wrote to
// stderr.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#include "engine/tensor.h"
#include "parallel/process_group.h"
#include "tests/parallel/fake_group.h"
#include "tools/comm_watchdog.h"

using namespace remat;

namespace {

struct Ended {
  int status = 0;
  std::string err;
};

// Runs `body` in a child process (which leaves with _exit(0) if `body`
// returns) and returns its wait status and stderr.
Ended in_child(const std::function<void()>& body) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    ::dup2(fds[1], STDERR_FILENO);
    body();
    ::_exit(0);
  }
  ::close(fds[1]);
  Ended e;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) e.err.append(buf, std::size_t(n));
  ::close(fds[0]);
  ::waitpid(pid, &e.status, 0);
  return e;
}

// SIGTERM's handler now (Catch2 installs its own while tests run).
void (*sigterm_handler())(int) {
  struct sigaction now;
  sigaction(SIGTERM, nullptr, &now);
  return now.sa_handler;
}

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

}  // namespace

TEST_CASE("install reads REMAT_COMM_TIMEOUT and arms the handler at the first collective of several ranks",
          "[tools]") {
  const Ended e = in_child([] {
    const auto before = sigterm_handler();
    ::setenv("REMAT_COMM_TIMEOUT", "42", 1);
    tools::install_comm_failure_handling();
    ::setenv("REMAT_COMM_TIMEOUT", "5", 1);
    tools::install_comm_failure_handling();  // once only
    if (comm_timeout() != 42) ::_exit(10);
    Tensor t = zeros({1});
    single_process_group()->all_reduce(t, ReduceOp::sum);
    if (sigterm_handler() != before) ::_exit(11);  // one process: nothing armed
    testing::TwoRankFakeGroup g;
    g.all_reduce(t, ReduceOp::sum);
    if (sigterm_handler() == before) ::_exit(12);
  });
  CHECK(WIFEXITED(e.status));
  CHECK(WEXITSTATUS(e.status) == 0);
}

TEST_CASE("the watchdog ends a rank whose collective runs past the comm timeout, naming it", "[tools]") {
  const Ended e = in_child([] {
    tools::install_comm_failure_handling();
    set_comm_timeout(0.2);
    testing::TwoRankFakeGroup g;
    g.during = [] { sleep_s(60); };  // a peer that never answers
    Tensor t = zeros({2});
    g.all_reduce(t, ReduceOp::sum);
  });
  REQUIRE(WIFEXITED(e.status));
  CHECK(WEXITSTATUS(e.status) == 1);
  CHECK(e.err == "remat: collective all_reduce (phase forward, 8 bytes, rank 0 of 2) did not finish within 0.2 s "
                 "(the comm timeout); a peer rank has failed or is stuck, so this rank exits\n");
}

TEST_CASE("SIGTERM inside a collective ends the rank with exit code 1, naming it", "[tools]") {
  const Ended e = in_child([] {
    tools::install_comm_failure_handling();
    testing::TwoRankFakeGroup g;
    g.during = [] { ::raise(SIGTERM); };
    Tensor t = zeros({3});
    g.broadcast(t, 0);
  });
  REQUIRE(WIFEXITED(e.status));
  CHECK(WEXITSTATUS(e.status) == 1);
  CHECK(e.err == "remat: terminated while in collective broadcast (phase forward, 12 bytes, rank 0 of 2); a peer "
                 "rank failed, so this rank exits too\n");
}

TEST_CASE("REMAT_FAULT kills the named rank at its N-th collective; other ranks and bad specs are left alone",
          "[tools]") {
  const auto run = [](const char* fault, const char* rank) {
    return in_child([=] {
      ::setenv("REMAT_FAULT", fault, 1);
      ::setenv("OMPI_COMM_WORLD_RANK", rank, 1);
      tools::install_comm_failure_handling();
      testing::TwoRankFakeGroup g;
      Tensor t = zeros({1});
      g.all_reduce(t, ReduceOp::sum);
      if (::write(STDERR_FILENO, "first done\n", 11) < 0) ::_exit(20);
      g.all_reduce(t, ReduceOp::sum);
      g.all_reduce(t, ReduceOp::sum);
    });
  };
  const Ended killed = run("kill:1:2", "1");
  REQUIRE(WIFSIGNALED(killed.status));
  CHECK(WTERMSIG(killed.status) == SIGKILL);
  CHECK(killed.err == "first done\nremat: REMAT_FAULT: killing this rank in the middle of a step\n");
  for (const auto& [fault, rank] : {std::pair{"kill:1:2", "0"}, std::pair{"kill:1", "1"}, std::pair{"oops:1:2", "1"}}) {
    const Ended spared = run(fault, rank);
    CHECK(WIFEXITED(spared.status));
    CHECK(spared.err == "first done\n");
  }
}
