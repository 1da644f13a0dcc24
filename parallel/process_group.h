// Process groups: collectives and point-to-point sends/receives over the
// ranks of a job. One interface, with an MPI back end for CPU tensors
// (OpenMPI, launched with mpirun), an NCCL back end for CUDA tensors
// (parallel/nccl_group.h) and a trivial one-process group when there is no
// launcher. Every collective, send and receive is counted (calls, bytes) by
// kind and by phase: original forward, backward, and replay inside
// recompute. docs/PARALLEL.md#process-groups-and-collectives.
//
// Failures: the back ends raise Error naming the collective (or the send /
// receive). This library never ends the process, installs signal handlers or
// injects faults on its own: it records the operation this process is
// blocked in and calls the hooks a program installs (set_collective_hooks).
// The remat tool installs a watchdog that ends a rank whose collective, send
// or receive runs past the comm timeout, a SIGTERM handler that names it, and
// the tests' fault injection (tools/comm_watchdog.h).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace remat {

enum class ReduceOp { sum, avg, max };
enum class CommPhase : std::uint8_t { forward, backward, replay };
// The kinds counted: the collectives, and the two halves of a point-to-point
// message (send counts the bytes sent, recv the bytes received).
enum class CollectiveKind : std::uint8_t {
  all_reduce,
  all_gather,
  reduce_scatter,
  all_to_all,
  broadcast,
  barrier,
  send,
  recv
};
constexpr std::size_t kCollectiveKinds = 8;
const char* collective_name(CollectiveKind k);
const char* phase_name(CommPhase p);

// Calls and bytes, per kind and phase: bytes sent for collectives and sends,
// bytes received for recv.
struct CommCounters {
  std::array<std::array<std::int64_t, 3>, kCollectiveKinds> calls{};
  std::array<std::array<std::int64_t, 3>, kCollectiveKinds> bytes{};
  std::int64_t calls_of(CollectiveKind k, CommPhase p) const { return calls[std::size_t(k)][std::size_t(p)]; }
  std::int64_t bytes_of(CollectiveKind k, CommPhase p) const { return bytes[std::size_t(k)][std::size_t(p)]; }
  // Over every kind.
  std::int64_t calls_in(CommPhase p) const;
  std::int64_t bytes_in(CommPhase p) const;
  CommCounters operator-(const CommCounters& o) const;
  CommCounters operator+(const CommCounters& o) const;
};

// The phase this thread is in now: a recompute replay, a backward, or the
// forward (unless a CommPhaseScope says otherwise).
CommPhase current_comm_phase();

// RAII: collectives on this thread count as `phase` (e.g. gradient buckets
// reduced right after backward returned still belong to the backward).
class CommPhaseScope {
 public:
  explicit CommPhaseScope(CommPhase phase);
  ~CommPhaseScope();
  CommPhaseScope(const CommPhaseScope&) = delete;
  CommPhaseScope& operator=(const CommPhaseScope&) = delete;

 private:
  int previous_;
};

// A collective, send or receive started without waiting (all_reduce_async,
// isend, irecv).
class CommWork {
 public:
  virtual ~CommWork() = default;
  // Blocks until the operation is done; throws Error naming it on failure.
  virtual void wait() = 0;
  // Lets the operation progress; true once it is done (a failure throws).
  virtual bool test() = 0;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: every rank's `t` becomes the reduction over ranks. Contiguous
  // f32 or i64 tensors of the same shape on every rank.
  virtual void all_reduce(Tensor& t, ReduceOp op) = 0;
  // Starts all_reduce(t, op); `t` must stay untouched until wait() returns.
  // The default runs it at once.
  virtual std::shared_ptr<CommWork> all_reduce_async(Tensor& t, ReduceOp op);
  // The ranks' tensors concatenated along dim 0 (same shape on every rank).
  virtual Tensor all_gather(const Tensor& t) = 0;
  // Starts all_gather(t) into `out`, allocated by the caller (contiguous, t's
  // dtype and device, dim 0 = size() x t's; ShapeError otherwise); `t` and
  // `out` must stay untouched until wait() returns. The default gathers at
  // once and copies.
  virtual std::shared_ptr<CommWork> all_gather_async(const Tensor& t, Tensor& out);
  // Reduces over ranks and returns this rank's slice of dim 0 (dim 0 must
  // divide by size()).
  virtual Tensor reduce_scatter(const Tensor& t, ReduceOp op) = 0;
  // Sends send_rows[r] consecutive rows of `t` (dim 0) to rank r, in rank
  // order; returns the rows received, in rank order, and their counts in
  // `recv_rows` (exchanged first unless `known_recv_rows` is given).
  virtual Tensor all_to_all(const Tensor& t, const std::vector<std::int64_t>& send_rows,
                            std::vector<std::int64_t>& recv_rows,
                            const std::vector<std::int64_t>* known_recv_rows = nullptr) = 0;
  // In place: every rank's `t` becomes root's.
  virtual void broadcast(Tensor& t, int root) = 0;
  virtual void barrier() = 0;
  // The sub-group of the ranks that pass the same `color`, ordered by `key`.
  virtual std::shared_ptr<ProcessGroup> split(int color, int key) = 0;
  // The same split, with every rank's (color, key) given by `color_key` of
  // its rank in this group: a pure function of the rank, the same on every
  // rank. A collective, as split; a simulated group (parallel/
  // simulated_group.h), which sees no other rank, evaluates it for each.
  virtual std::shared_ptr<ProcessGroup> split_by(const std::function<std::pair<int, int>(int rank)>& color_key);

  // Point to point. Tensors are contiguous and on the group's device (CPU for
  // MPI, the group's CUDA device for NCCL); `dst` / `src` is another rank of
  // this group; tags are >= 0. Anything else throws Error naming the op, the
  // ranks and what was expected; the one-process group has no peers and
  // refuses every send and receive.
  //
  // Starts sending `t`'s bytes to rank `dst`; `t` must stay alive and
  // untouched until wait() returns.
  virtual std::shared_ptr<CommWork> isend(const Tensor& t, int dst, int tag) = 0;
  // Starts receiving a message from rank `src` with `tag` into the
  // preallocated `t` (shape and dtype agreed by the program). On MPI a
  // message of another size is an Error (at wait/test) naming both ranks, the
  // tag and both byte counts, and messages match by (source, tag). NCCL has
  // no tags: messages between two ranks match in the order they were started,
  // and sizes must agree (not checked).
  virtual std::shared_ptr<CommWork> irecv(Tensor& t, int src, int tag) = 0;
  // The blocking forms: isend(...)->wait(), irecv(...)->wait().
  void send(const Tensor& t, int dst, int tag);
  void recv(Tensor& t, int src, int tag);

  CommCounters counters() const { return counters_; }
  void reset_counters() { counters_ = CommCounters{}; }

 protected:
  // Counts a collective this rank starts (and applies any injected fault).
  void count(CollectiveKind kind, std::int64_t bytes);
  // Throws the errors every back end gives a send (kind send) or receive
  // (kind recv): peer out of range or this rank, negative tag, undefined or
  // non-contiguous tensor, tensor not on `device` (`backend` names the group
  // in the message, e.g. "the MPI group").
  void check_p2p(CollectiveKind kind, const Tensor& t, int peer, int tag, Device device, const char* backend) const;

 private:
  CommCounters counters_;
};

// True when every rank of `g` passed the same `sequence` (e.g. the order in
// which it started its reductions): a fingerprint of it, compared by one
// host-tagged all-reduce (max of the value and of its negation). A collective.
bool same_on_every_rank(ProcessGroup& g, const std::vector<std::size_t>& sequence);
// Element by element, the most of `values` over the ranks of `g` (one
// host-tagged all-reduce; every rank passes as many). A collective.
std::vector<std::int64_t> most_over_ranks(ProcessGroup& g, const std::vector<std::int64_t>& values);
// Whether a step every rank ran on its own failed anywhere: `mine` is this
// rank's failure message (nullopt when it succeeded). Returns nullopt when
// no rank failed, else the lowest failing rank and its message, the same on
// every rank (host-tagged: an all-reduce, then two broadcasts). A
// collective: lets every rank stop together where only some saw the fault.
struct RankFailure {
  int rank;
  std::string message;
};
std::optional<RankFailure> first_failure(ProcessGroup& g, const std::optional<std::string>& mine);

// The ShapeError every back end gives all_gather_async for an output that
// is not contiguous, of t's dtype and device, with dim 0 = size x t's.
void check_gather_output(const Tensor& t, const Tensor& out, int size);

// How errors name a send or receive (kind send / recv): "send to rank 1
// (tag 3, rank 0 of 2)", "recv from rank 0 (tag 3, rank 1 of 2)".
std::string p2p_name(CollectiveKind kind, int peer, int tag, int rank, int size);

// RAII, used by the back ends: marks this process as inside a collective,
// so a timeout or a termination can name it.
class CollectiveInFlight {
 public:
  CollectiveInFlight(CollectiveKind kind, std::int64_t bytes, int rank, int size);
  // A send or receive (kind send / recv) with `peer`, started in `phase`.
  CollectiveInFlight(CollectiveKind kind, CommPhase phase, std::int64_t bytes, int rank, int size, int peer, int tag);
  ~CollectiveInFlight();
  CollectiveInFlight(const CollectiveInFlight&) = delete;
  CollectiveInFlight& operator=(const CollectiveInFlight&) = delete;
};

// Seconds a collective may take before this rank gives up on its peers
// (default 300; 0: never): the NCCL back end aborts its communicator and
// throws a little before it, a watchdog a program installs ends the process.
void set_comm_timeout(double seconds);
double comm_timeout();

// The collective, send or receive this process is blocked in (the latest
// CollectiveInFlight of a group of several ranks), e.g. "collective
// all_to_all (phase forward, 4096 bytes, rank 0 of 2)", "send to rank 1 (tag
// 3, phase forward, 4096 bytes, rank 0 of 2)" or "recv from rank 0 (tag 3,
// ...)" (the phase a send or receive was started in), or null when it is in
// none; and the seconds it has been blocked (negative when in none). Both
// are async-signal-safe, for a watchdog thread or a signal handler; the text
// may change under a reader while another collective starts.
const char* collective_in_flight();
double collective_in_flight_seconds();

// Hooks a program installs to watch its collectives (the remat tool does;
// library code never does). Both run on the thread of a collective, send or
// receive of a group of several ranks, before it communicates: `on_count`
// when it is counted (a send / receive when it is started), with how many
// this process has counted so far (1, 2, ...); `on_block` when the thread
// is about to block in it (collective_in_flight() names it). Null: nothing
// (the default). Set them before any collective.
struct CollectiveHooks {
  void (*on_count)(std::int64_t counted) = nullptr;
  void (*on_block)() = nullptr;
};
void set_collective_hooks(CollectiveHooks hooks);

// The world group: MPI's when the process was started by an MPI launcher
// (MPI is initialised on first use and finalised at exit), else a group of
// one process.
std::shared_ptr<ProcessGroup> world_group();

// Ends every rank of the job with exit code `code` (MPI_Abort) when this
// process runs under an MPI launcher, so that no peer waits forever on a
// rank that failed; otherwise returns.
void abort_job(int code);

// A CommWork that is already done (what a group returns for an operation it
// completed at once).
std::shared_ptr<CommWork> done_work();

// A group of one process (collectives are identities).
std::shared_ptr<ProcessGroup> single_process_group();

}  // namespace remat
