#include "parallel/process_group.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>

#include "engine/autograd.h"
#include "engine/recompute_context.h"

namespace remat {

const char* collective_name(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::all_reduce: return "all_reduce";
    case CollectiveKind::all_gather: return "all_gather";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
    case CollectiveKind::all_to_all: return "all_to_all";
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::barrier: return "barrier";
    case CollectiveKind::send: return "send";
    case CollectiveKind::recv: return "recv";
  }
  return "?";
}

const char* phase_name(CommPhase p) {
  switch (p) {
    case CommPhase::forward: return "forward";
    case CommPhase::backward: return "backward";
    case CommPhase::replay: return "replay";
  }
  return "?";
}

std::int64_t CommCounters::calls_in(CommPhase p) const {
  std::int64_t n = 0;
  for (const auto& k : calls) n += k[std::size_t(p)];
  return n;
}

std::int64_t CommCounters::bytes_in(CommPhase p) const {
  std::int64_t n = 0;
  for (const auto& k : bytes) n += k[std::size_t(p)];
  return n;
}

CommCounters CommCounters::operator-(const CommCounters& o) const {
  CommCounters d;
  for (std::size_t k = 0; k < kCollectiveKinds; ++k)
    for (std::size_t p = 0; p < 3; ++p) {
      d.calls[k][p] = calls[k][p] - o.calls[k][p];
      d.bytes[k][p] = bytes[k][p] - o.bytes[k][p];
    }
  return d;
}

CommCounters CommCounters::operator+(const CommCounters& o) const {
  CommCounters d;
  for (std::size_t k = 0; k < kCollectiveKinds; ++k)
    for (std::size_t p = 0; p < 3; ++p) {
      d.calls[k][p] = calls[k][p] + o.calls[k][p];
      d.bytes[k][p] = bytes[k][p] + o.bytes[k][p];
    }
  return d;
}

namespace {
thread_local int tls_phase_override = -1;
}  // namespace

CommPhaseScope::CommPhaseScope(CommPhase phase) : previous_(tls_phase_override) { tls_phase_override = int(phase); }
CommPhaseScope::~CommPhaseScope() { tls_phase_override = previous_; }

CommPhase current_comm_phase() {
  if (tls_phase_override >= 0) return CommPhase(tls_phase_override);
  if (in_recompute()) return CommPhase::replay;
  if (backward_mode() != BackwardMode::none) return CommPhase::backward;
  return CommPhase::forward;
}

// ---------------------------------------------------------------------------
// Failure handling: what this process is blocked in, and the hooks a program
// installs (the watchdog, signal handler and fault injection live in tools/).

namespace {

// The collective in flight, readable from a signal handler: the text is
// written before `g_since_ns` is set and cleared after it is reset.
char g_what[256];
std::atomic<std::int64_t> g_since_ns{0};
std::atomic<std::int64_t> g_counted{0};  // collectives of several ranks this process counted
std::atomic<double> g_timeout_s{300};
std::atomic<void (*)(std::int64_t)> g_on_count{nullptr};
std::atomic<void (*)()> g_on_block{nullptr};

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void set_comm_timeout(double seconds) { g_timeout_s.store(seconds); }
double comm_timeout() { return g_timeout_s.load(); }

const char* collective_in_flight() { return g_since_ns.load() != 0 ? g_what : nullptr; }

double collective_in_flight_seconds() {
  const std::int64_t since = g_since_ns.load();
  return since == 0 ? -1.0 : double(now_ns() - since) * 1e-9;
}

void set_collective_hooks(CollectiveHooks hooks) {
  g_on_count.store(hooks.on_count);
  g_on_block.store(hooks.on_block);
}

CollectiveInFlight::CollectiveInFlight(CollectiveKind kind, std::int64_t bytes, int rank, int size) {
  if (size <= 1) return;
  std::snprintf(g_what, sizeof g_what, "collective %s (phase %s, %lld bytes, rank %d of %d)", collective_name(kind),
                phase_name(current_comm_phase()), static_cast<long long>(bytes), rank, size);
  g_since_ns.store(now_ns());
  if (auto hook = g_on_block.load()) hook();
}

CollectiveInFlight::CollectiveInFlight(CollectiveKind kind, CommPhase phase, std::int64_t bytes, int rank, int size,
                                       int peer, int tag) {
  if (size <= 1) return;
  std::snprintf(g_what, sizeof g_what, "%s rank %d (tag %d, phase %s, %lld bytes, rank %d of %d)",
                kind == CollectiveKind::send ? "send to" : "recv from", peer, tag, phase_name(phase),
                static_cast<long long>(bytes), rank, size);
  g_since_ns.store(now_ns());
  if (auto hook = g_on_block.load()) hook();
}

CollectiveInFlight::~CollectiveInFlight() { g_since_ns.store(0); }

std::string p2p_name(CollectiveKind kind, int peer, int tag, int rank, int size) {
  return detail::concat(kind == CollectiveKind::send ? "send to" : "recv from", " rank ", peer, " (tag ", tag,
                        ", rank ", rank, " of ", size, ")");
}

void ProcessGroup::count(CollectiveKind kind, std::int64_t bytes) {
  const auto p = std::size_t(current_comm_phase());
  counters_.calls[std::size_t(kind)][p]++;
  counters_.bytes[std::size_t(kind)][p] += bytes;
  if (size() <= 1) return;
  const std::int64_t n = ++g_counted;
  if (auto hook = g_on_count.load()) hook(n);
}

void ProcessGroup::check_p2p(CollectiveKind kind, const Tensor& t, int peer, int tag, Device device,
                             const char* backend) const {
  const int r = rank(), n = size();
  const auto what = [&] { return p2p_name(kind, peer, tag, r, n); };
  const bool send = kind == CollectiveKind::send;
  REMAT_CHECK(n > 1, Error, what(), ": a group of one process has no peers to ", send ? "send to" : "receive from");
  REMAT_CHECK(peer >= 0 && peer < n, Error, what(), ": no such rank; the ", send ? "destination" : "source",
              " must be another rank of this group, 0 to ", n - 1);
  REMAT_CHECK(peer != r, Error, what(), ": a rank cannot ", send ? "send to" : "receive from",
              " itself; the peer must be another rank of this group");
  REMAT_CHECK(tag >= 0, Error, what(), ": the tag must be >= 0");
  REMAT_CHECK(t.defined(), Error, what(), ": the tensor is undefined");
  REMAT_CHECK(t.is_contiguous(), ShapeError, what(), ": the tensor must be contiguous, got sizes ",
              shape_str(t.sizes()), " with strides ", shape_str(t.strides()));
  REMAT_CHECK(t.device() == device, DeviceError, what(), ": the tensor is on ", t.device(), ", expected ", device,
              " (", backend, "'s device)");
}

void ProcessGroup::send(const Tensor& t, int dst, int tag) { isend(t, dst, tag)->wait(); }

void ProcessGroup::recv(Tensor& t, int src, int tag) { irecv(t, src, tag)->wait(); }

namespace {

class DoneWork final : public CommWork {
 public:
  void wait() override {}
  bool test() override { return true; }
};

class SingleProcessGroup final : public ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce(Tensor& t, ReduceOp) override { count(CollectiveKind::all_reduce, std::int64_t(t.nbytes())); }
  Tensor all_gather(const Tensor& t) override {
    count(CollectiveKind::all_gather, std::int64_t(t.nbytes()));
    return t.clone();
  }
  Tensor reduce_scatter(const Tensor& t, ReduceOp) override {
    count(CollectiveKind::reduce_scatter, std::int64_t(t.nbytes()));
    return t.clone();
  }
  Tensor all_to_all(const Tensor& t, const std::vector<std::int64_t>& send_rows, std::vector<std::int64_t>& recv_rows,
                    const std::vector<std::int64_t>*) override {
    REMAT_CHECK(send_rows.size() == 1 && send_rows[0] == t.size(0), ShapeError, "all_to_all: one rank sends all ",
                t.size(0), " rows to itself");
    count(CollectiveKind::all_to_all, std::int64_t(t.nbytes()));
    recv_rows = send_rows;
    return t.clone();
  }
  void broadcast(Tensor& t, int) override { count(CollectiveKind::broadcast, std::int64_t(t.nbytes())); }
  void barrier() override {}
  std::shared_ptr<ProcessGroup> split(int, int) override { return std::make_shared<SingleProcessGroup>(); }
  // No peers: check_p2p refuses every send and receive.
  std::shared_ptr<CommWork> isend(const Tensor& t, int dst, int tag) override {
    check_p2p(CollectiveKind::send, t, dst, tag, kCPU, "the one-process group");
    return std::make_shared<DoneWork>();
  }
  std::shared_ptr<CommWork> irecv(Tensor& t, int src, int tag) override {
    check_p2p(CollectiveKind::recv, t, src, tag, kCPU, "the one-process group");
    return std::make_shared<DoneWork>();
  }
};

}  // namespace

std::shared_ptr<CommWork> done_work() { return std::make_shared<DoneWork>(); }

std::shared_ptr<CommWork> ProcessGroup::all_reduce_async(Tensor& t, ReduceOp op) {
  all_reduce(t, op);
  return done_work();
}

bool same_on_every_rank(ProcessGroup& g, const std::vector<std::size_t>& sequence) {
  std::int64_t fp = 0;
  for (std::size_t x : sequence) fp = (fp * 1000003 + std::int64_t(x) + 1) % 2147483647;
  TagScope host(kHostTag);
  Tensor v = from_vector<std::int64_t>({fp, -fp}, {2});
  g.all_reduce(v, ReduceOp::max);
  const auto m = v.to_vector<std::int64_t>();
  return m[0] == -m[1];
}

std::vector<std::int64_t> most_over_ranks(ProcessGroup& g, const std::vector<std::int64_t>& values) {
  TagScope host(kHostTag);
  Tensor t = from_vector<std::int64_t>(values, {std::int64_t(values.size())});
  g.all_reduce(t, ReduceOp::max);
  return t.to_vector<std::int64_t>();
}

std::optional<RankFailure> first_failure(ProcessGroup& g, const std::optional<std::string>& mine) {
  const int W = g.size();
  std::vector<std::int64_t> failed(std::size_t(W), 0);
  if (mine) failed[std::size_t(g.rank())] = 1;
  failed = most_over_ranks(g, failed);
  int first = 0;
  while (first < W && failed[std::size_t(first)] == 0) ++first;
  if (first == W) return std::nullopt;
  TagScope host(kHostTag);
  const std::string text = g.rank() == first ? *mine : std::string();
  Tensor len = from_vector<std::int64_t>({std::int64_t(text.size())}, {1}, kCPU);
  g.broadcast(len, first);
  const std::int64_t n = len.to_vector<std::int64_t>()[0];
  std::vector<std::int64_t> chars(std::size_t(std::max<std::int64_t>(n, 1)), 0);
  for (std::size_t i = 0; i < text.size(); ++i) chars[i] = static_cast<unsigned char>(text[i]);
  Tensor t = from_vector<std::int64_t>(chars, {std::int64_t(chars.size())}, kCPU);
  g.broadcast(t, first);
  RankFailure out{first, std::string()};
  const std::vector<std::int64_t> got = t.to_vector<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) out.message.push_back(char(got[std::size_t(i)]));
  return out;
}

void check_gather_output(const Tensor& t, const Tensor& out, int size) {
  Shape want = t.sizes();
  REMAT_CHECK(!want.empty(), ShapeError, "all_gather: needs at least one dim");
  want[0] *= size;
  REMAT_CHECK(out.defined() && out.sizes() == want && out.dtype() == t.dtype() && out.is_contiguous() &&
                  out.device() == t.device(),
              ShapeError, "all_gather_async: the output must be a contiguous ", dtype_name(t.dtype()), " tensor of ",
              shape_str(want), " on ", t.device(), ", got ",
              out.defined() ? shape_str(out.sizes()) + " " + dtype_name(out.dtype()) : std::string("none"));
}

std::shared_ptr<CommWork> ProcessGroup::all_gather_async(const Tensor& t, Tensor& out) {
  check_gather_output(t, out, size());
  const Tensor all = all_gather(t);
  NoGradGuard ng;
  out.copy_(all);
  return done_work();
}

std::shared_ptr<ProcessGroup> ProcessGroup::split_by(const std::function<std::pair<int, int>(int)>& color_key) {
  const auto [color, key] = color_key(rank());
  return split(color, key);
}

std::shared_ptr<ProcessGroup> single_process_group() { return std::make_shared<SingleProcessGroup>(); }

}  // namespace remat
