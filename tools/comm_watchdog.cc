#include "tools/comm_watchdog.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "parallel/process_group.h"

namespace remat::tools {

namespace {

// REMAT_FAULT, parsed once by install_comm_failure_handling (read-only after).
struct Fault {
  enum Kind { none, kill, hang } kind = none;
  long long at = -1;  // the counted collective / send / receive (1-based) at which it strikes
};
Fault g_fault;
std::once_flag g_start_once;

// Async-signal-safe: write(2) only.
void write_err(const char* a, const char* b = "", const char* c = "") {
  for (const char* s : {a, b, c}) {
    std::size_t n = std::strlen(s);
    while (n > 0) {
      const ssize_t w = ::write(STDERR_FILENO, s, n);
      if (w <= 0) return;
      s += w;
      n -= std::size_t(w);
    }
  }
}

void on_terminate(int) {
  if (const char* what = collective_in_flight())
    write_err("remat: terminated while in ", what, "; a peer rank failed, so this rank exits too\n");
  else
    write_err("remat: terminated by the launcher (a peer rank failed or the job was cancelled)\n");
  ::_exit(1);
}

void watchdog() {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const double limit = comm_timeout();
    const double waited = collective_in_flight_seconds();
    if (waited < 0 || limit <= 0 || waited < limit) continue;
    const char* what = collective_in_flight();
    if (!what) continue;  // it finished meanwhile
    char secs[32];
    std::snprintf(secs, sizeof secs, "%g", limit);
    write_err("remat: ", what, " did not finish within ");
    write_err(secs, " s (the comm timeout); a peer rank has failed or is stuck, so this rank exits\n");
    ::_exit(1);
  }
}

// The first collective (or send / receive) of several ranks that blocks
// starts the watchdog and the handler.
void start_failure_handling() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_terminate;
  sigaction(SIGTERM, &sa, nullptr);
  std::thread(watchdog).detach();
}

void on_block() { std::call_once(g_start_once, start_failure_handling); }

void on_count(std::int64_t n) {
  if (g_fault.kind == Fault::none || n != g_fault.at) return;
  if (g_fault.kind == Fault::kill) {
    write_err("remat: REMAT_FAULT: killing this rank in the middle of a step\n");
    ::kill(::getpid(), SIGKILL);
  } else {
    write_err("remat: REMAT_FAULT: this rank stops responding\n");
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

// REMAT_FAULT=kill:RANK:N or hang:RANK:N, for this rank only.
Fault parse_fault() {
  const char* spec = std::getenv("REMAT_FAULT");
  if (!spec) return {};
  char what[8] = {0};
  int rank = -1;
  long long at = -1;
  if (std::sscanf(spec, "%7[a-z]:%d:%lld", what, &rank, &at) != 3) return {};
  const char* world_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (!world_rank || std::atoi(world_rank) != rank) return {};
  if (std::strcmp(what, "kill") == 0) return {Fault::kill, at};
  if (std::strcmp(what, "hang") == 0) return {Fault::hang, at};
  return {};
}

}  // namespace

void install_comm_failure_handling() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (const char* t = std::getenv("REMAT_COMM_TIMEOUT")) set_comm_timeout(std::atof(t));
    g_fault = parse_fault();
    set_collective_hooks({on_count, on_block});
  });
}

}  // namespace remat::tools
