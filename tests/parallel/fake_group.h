// A group that claims two ranks but runs in one process: each collective is
// counted and marked in flight as a back end does (ProcessGroup::count,
// CollectiveInFlight), and `during` runs while it is in flight. Sends and
// receives (to / from rank 1) are checked and counted when started and in
// flight while waited for; they move nothing. For testing what the library
// (and a program's hooks) do around a collective.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "engine/error.h"
#include "parallel/process_group.h"

namespace remat::testing {

class TwoRankFakeGroup final : public ProcessGroup {
 public:
  std::function<void()> during;

  int rank() const override { return 0; }
  int size() const override { return 2; }
  void all_reduce(Tensor& t, ReduceOp) override { run(CollectiveKind::all_reduce, std::int64_t(t.nbytes())); }
  Tensor all_gather(const Tensor& t) override {
    run(CollectiveKind::all_gather, std::int64_t(t.nbytes()));
    return t;
  }
  Tensor reduce_scatter(const Tensor& t, ReduceOp) override {
    run(CollectiveKind::reduce_scatter, std::int64_t(t.nbytes()));
    return t;
  }
  Tensor all_to_all(const Tensor& t, const std::vector<std::int64_t>& send_rows, std::vector<std::int64_t>& recv_rows,
                    const std::vector<std::int64_t>*) override {
    run(CollectiveKind::all_to_all, std::int64_t(t.nbytes()));
    recv_rows = send_rows;
    return t;
  }
  void broadcast(Tensor& t, int) override { run(CollectiveKind::broadcast, std::int64_t(t.nbytes())); }
  void barrier() override {
    CollectiveInFlight busy(CollectiveKind::barrier, 0, rank(), size());
    if (during) during();
  }
  std::shared_ptr<ProcessGroup> split(int, int) override { throw Error("TwoRankFakeGroup: split is not supported"); }
  std::shared_ptr<CommWork> isend(const Tensor& t, int dst, int tag) override {
    return p2p(CollectiveKind::send, t, dst, tag);
  }
  std::shared_ptr<CommWork> irecv(Tensor& t, int src, int tag) override {
    return p2p(CollectiveKind::recv, t, src, tag);
  }

 private:
  class Work final : public CommWork {
   public:
    Work(TwoRankFakeGroup* g, CollectiveKind kind, std::int64_t bytes, int peer, int tag)
        : g_(g), kind_(kind), phase_(current_comm_phase()), bytes_(bytes), peer_(peer), tag_(tag) {}
    void wait() override {
      CollectiveInFlight busy(kind_, phase_, bytes_, g_->rank(), g_->size(), peer_, tag_);
      if (g_->during) g_->during();
    }
    bool test() override { return true; }

   private:
    TwoRankFakeGroup* g_;
    CollectiveKind kind_;
    CommPhase phase_;
    std::int64_t bytes_;
    int peer_, tag_;
  };

  std::shared_ptr<CommWork> p2p(CollectiveKind kind, const Tensor& t, int peer, int tag) {
    check_p2p(kind, t, peer, tag, kCPU, "the fake group");
    count(kind, std::int64_t(t.nbytes()));
    return std::make_shared<Work>(this, kind, std::int64_t(t.nbytes()), peer, tag);
  }

  void run(CollectiveKind kind, std::int64_t bytes) {
    count(kind, bytes);
    CollectiveInFlight busy(kind, bytes, rank(), size());
    if (during) during();
  }
};

}  // namespace remat::testing
