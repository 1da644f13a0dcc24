// A group that claims two ranks but runs in one process: each collective is
// counted and marked in flight as a back end does (ProcessGroup::count,
// CollectiveInFlight), and `during` runs while it is in flight. For testing
// what the library (and a program's hooks) do around a collective.
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

 private:
  void run(CollectiveKind kind, std::int64_t bytes) {
    count(kind, bytes);
    CollectiveInFlight busy(kind, bytes, rank(), size());
    if (during) during();
  }
};

}  // namespace remat::testing
