// Process groups: collectives over the ranks of a job. One interface, with an
// MPI back end for CPU tensors (OpenMPI, launched with mpirun) and a trivial
// one-process group when there is no launcher. Every collective is counted
// (calls, bytes), split by phase: original forward, backward, and replay
// inside recompute. DESIGN.md §6.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/tensor.h"

namespace remat {

enum class ReduceOp { sum, avg, max };
enum class CommPhase : std::uint8_t { forward, backward, replay };

// Calls and bytes sent per phase.
struct CommCounters {
  std::array<std::int64_t, 3> calls{};
  std::array<std::int64_t, 3> bytes{};
  std::int64_t calls_in(CommPhase p) const { return calls[std::size_t(p)]; }
  std::int64_t bytes_in(CommPhase p) const { return bytes[std::size_t(p)]; }
};

// The phase this thread is in now: a recompute replay, a backward, or the forward.
CommPhase current_comm_phase();

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: every rank's `t` becomes the reduction over ranks. CPU
  // contiguous f32 or i64 tensors of the same shape on every rank.
  virtual void all_reduce(Tensor& t, ReduceOp op) = 0;
  // The ranks' tensors concatenated along dim 0 (same shape on every rank).
  virtual Tensor all_gather(const Tensor& t) = 0;
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

  CommCounters counters() const { return counters_; }
  void reset_counters() { counters_ = CommCounters{}; }

 protected:
  void count(std::int64_t bytes);

 private:
  CommCounters counters_;
};

// The world group: MPI's when the process was started by an MPI launcher
// (MPI is initialised on first use and finalised at exit), else a group of
// one process.
std::shared_ptr<ProcessGroup> world_group();

// A group of one process (collectives are identities).
std::shared_ptr<ProcessGroup> single_process_group();

}  // namespace remat
