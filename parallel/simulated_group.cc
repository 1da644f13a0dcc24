#include "parallel/simulated_group.h"

#include <algorithm>
#include <cstring>
#include <numeric>

namespace remat {

namespace {

class SimulatedGroup final : public ProcessGroup {
 public:
  SimulatedGroup(std::vector<int> world_ranks, int rank) : ranks_(std::move(world_ranks)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return int(ranks_.size()); }
  const std::vector<int>& world_ranks() const { return ranks_; }

  void all_reduce(Tensor& t, ReduceOp op) override {
    check(t, "all_reduce");
    count(CollectiveKind::all_reduce, std::int64_t(t.nbytes()));
    if (op == ReduceOp::sum) scale(t, "all_reduce");
    t.bump_version();
  }

  Tensor all_gather(const Tensor& t_in) override {
    check(t_in, "all_gather");
    Tensor t = t_in.contiguous();
    Shape s = t.sizes();
    REMAT_CHECK(!s.empty(), ShapeError, "all_gather: needs at least one dim");
    s[0] *= size();
    Tensor out = empty(s, TensorOptions(t.dtype(), t.device()));
    count(CollectiveKind::all_gather, std::int64_t(t.nbytes()));
    if (!t.device().is_meta())
      for (int r = 0; r < size(); ++r)
        std::memcpy(static_cast<char*>(out.raw_data()) + std::size_t(r) * t.nbytes(), t.raw_data(), t.nbytes());
    return out;
  }

  std::shared_ptr<CommWork> all_gather_async(const Tensor& t_in, Tensor& out) override {
    check(t_in, "all_gather");
    Tensor t = t_in.contiguous();
    check_gather_output(t, out, size());
    count(CollectiveKind::all_gather, std::int64_t(t.nbytes()));
    if (!t.device().is_meta())
      for (int r = 0; r < size(); ++r)
        std::memcpy(static_cast<char*>(out.raw_data()) + std::size_t(r) * t.nbytes(), t.raw_data(), t.nbytes());
    out.bump_version();
    return done_work();
  }

  Tensor reduce_scatter(const Tensor& t_in, ReduceOp op) override {
    check(t_in, "reduce_scatter");
    Tensor t = t_in.contiguous();
    REMAT_CHECK(t.dim() >= 1 && t.size(0) % size() == 0, ShapeError, "reduce_scatter: dim 0 of ",
                shape_str(t.sizes()), " must divide by the group size ", size());
    Shape s = t.sizes();
    s[0] /= size();
    Tensor out = empty(s, TensorOptions(t.dtype(), t.device()));
    count(CollectiveKind::reduce_scatter, std::int64_t(t.nbytes()));
    if (!t.device().is_meta()) {
      std::memcpy(out.raw_data(), static_cast<const char*>(t.raw_data()) + std::size_t(rank_) * out.nbytes(),
                  out.nbytes());
      if (op == ReduceOp::sum) scale(out, "reduce_scatter");
    }
    return out;
  }

  Tensor all_to_all(const Tensor& t_in, const std::vector<std::int64_t>& send_rows, std::vector<std::int64_t>& recv_rows,
                    const std::vector<std::int64_t>* known_recv_rows) override {
    check(t_in, "all_to_all");
    Tensor t = t_in.contiguous();
    REMAT_CHECK(int(send_rows.size()) == size(), ShapeError, "all_to_all: ", send_rows.size(),
                " send counts for a group of ", size());
    const std::int64_t total = std::accumulate(send_rows.begin(), send_rows.end(), std::int64_t(0));
    REMAT_CHECK(t.dim() >= 1 && total == t.size(0), ShapeError, "all_to_all: send counts add up to ", total,
                " rows but the tensor has ", t.dim() ? t.size(0) : 0);
    if (known_recv_rows) {
      recv_rows = *known_recv_rows;
    } else {  // every rank sends this one what this one sends itself
      recv_rows.assign(std::size_t(size()), send_rows[std::size_t(rank_)]);
      count(CollectiveKind::all_to_all, std::int64_t(size()) * 8);
    }
    Shape s = t.sizes();
    s[0] = std::accumulate(recv_rows.begin(), recv_rows.end(), std::int64_t(0));
    Tensor out = empty(s, TensorOptions(t.dtype(), t.device()));
    count(CollectiveKind::all_to_all, std::int64_t(t.nbytes()));
    if (!t.device().is_meta()) {
      REMAT_CHECK(known_recv_rows == nullptr || std::all_of(recv_rows.begin(), recv_rows.end(), [&](std::int64_t n) {
                    return n == send_rows[std::size_t(rank_)];
                  }), Error, "all_to_all on ", what(), ": the given receive counts are not what every rank sends "
                  "this one (", send_rows[std::size_t(rank_)], " rows each), so there are no values to give");
      const std::size_t row = t.size(0) ? t.nbytes() / std::size_t(t.size(0)) : 0;
      const std::int64_t first = std::accumulate(send_rows.begin(), send_rows.begin() + rank_, std::int64_t(0));
      const std::size_t mine = std::size_t(send_rows[std::size_t(rank_)]) * row;
      for (int r = 0; r < size(); ++r)
        std::memcpy(static_cast<char*>(out.raw_data()) + std::size_t(r) * mine,
                    static_cast<const char*>(t.raw_data()) + std::size_t(first) * row, mine);
    }
    return out;
  }

  void broadcast(Tensor& t, int root) override {
    check(t, "broadcast");
    REMAT_CHECK(root >= 0 && root < size(), Error, "broadcast from rank ", root, " on ", what(), ": no such rank");
    count(CollectiveKind::broadcast, std::int64_t(t.nbytes()));
  }

  void barrier() override {}

  std::shared_ptr<ProcessGroup> split(int, int) override {
    throw Error("split on " + what() + ": a simulated rank cannot see the other ranks' colors; split it with "
                "split_by (every rank's color and key as a function of its rank)");
  }

  std::shared_ptr<ProcessGroup> split_by(const std::function<std::pair<int, int>(int)>& color_key) override {
    const int color = color_key(rank_).first;
    std::vector<std::pair<int, int>> members;  // (key, rank) of the ranks with this color
    for (int r = 0; r < size(); ++r) {
      const auto [c, k] = color_key(r);
      if (c == color) members.emplace_back(k, r);
    }
    std::sort(members.begin(), members.end());
    std::vector<int> ranks;
    int mine = 0;
    for (const auto& [k, r] : members) {
      if (r == rank_) mine = int(ranks.size());
      ranks.push_back(ranks_[std::size_t(r)]);
    }
    return std::make_shared<SimulatedGroup>(std::move(ranks), mine);
  }

  std::shared_ptr<CommWork> isend(const Tensor& t, int dst, int tag) override {
    check_p2p(CollectiveKind::send, t, dst, tag, t.device(), "the simulated group");
    check(t, p2p_name(CollectiveKind::send, dst, tag, rank_, size()).c_str());
    count(CollectiveKind::send, std::int64_t(t.nbytes()));
    return done_work();
  }

  std::shared_ptr<CommWork> irecv(Tensor& t, int src, int tag) override {
    check_p2p(CollectiveKind::recv, t, src, tag, t.device(), "the simulated group");
    const std::string name = p2p_name(CollectiveKind::recv, src, tag, rank_, size());
    check(t, name.c_str());
    REMAT_CHECK(t.device().is_meta(), Error, name, " on ", what(), ": a simulated rank receives shapes only (a meta "
                "tensor), but this receive into ", t.device(), " ", t.dtype(), " ", shape_str(t.sizes()),
                " wants another rank's values");
    count(CollectiveKind::recv, std::int64_t(t.nbytes()));
    return done_work();
  }

 private:
  std::string what() const {
    return "simulated rank " + std::to_string(rank_) + " of " + std::to_string(size());
  }
  // Meta or CPU tensors only.
  void check(const Tensor& t, const char* op) const {
    REMAT_CHECK(t.defined(), Error, op, " on ", what(), ": the tensor is undefined");
    REMAT_CHECK(t.device().is_meta() || t.device().is_cpu(), DeviceError, op, " on ", what(), ": the tensor is on ",
                t.device(), ", expected meta (shapes) or cpu (host values)");
  }
  // Host values times the group size (the sum over ranks that hold the same).
  void scale(Tensor& t, const char* op) const {
    if (t.device().is_meta()) return;
    const std::int64_t n = size();
    if (t.dtype() == DType::f32) {
      for (float* p = t.data<float>(), *e = p + t.numel(); p != e; ++p) *p *= float(n);
    } else if (t.dtype() == DType::i64) {
      for (std::int64_t *p = t.data<std::int64_t>(), *e = p + t.numel(); p != e; ++p) *p *= n;
    } else {
      throw DTypeError(std::string(op) + " on " + what() + ": host values of " + dtype_name(t.dtype()) +
                       ", expected f32 or i64");
    }
  }

  std::vector<int> ranks_;  // world ranks, in group order
  int rank_;
};

}  // namespace

std::shared_ptr<ProcessGroup> simulated_world(int size, int rank) {
  REMAT_CHECK(size >= 1 && rank >= 0 && rank < size, Error, "simulated rank ", rank, " of ", size,
              " ranks: expected a rank from 0 to ", size - 1);
  std::vector<int> ranks(static_cast<std::size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  return std::make_shared<SimulatedGroup>(std::move(ranks), rank);
}

std::vector<int> simulated_world_ranks(const ProcessGroup& g) {
  const auto* s = dynamic_cast<const SimulatedGroup*>(&g);
  return s ? s->world_ranks() : std::vector<int>{};
}

}  // namespace remat
