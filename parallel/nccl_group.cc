#include "parallel/nccl_group.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>


namespace remat {

namespace {

void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw DeviceError(std::string("NCCL group: ") + what + ": " + cudaGetErrorString(rc));
}

ncclDataType_t nccl_type(const Tensor& t, const char* op) {
  REMAT_CHECK(t.device().is_cuda() && t.is_contiguous(), DeviceError, op,
              ": the NCCL back end takes contiguous CUDA tensors, got ", shape_str(t.sizes()), " on ", t.device());
  switch (t.dtype()) {
    case DType::f32: return ncclFloat32;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    default: throw DTypeError(std::string(op) + ": the NCCL back end does not support " + dtype_name(t.dtype()));
  }
}

class NcclGroup;

// An event recorded on the group's stream after a launch of queued sends and
// receives; shared by the works of that launch.
struct LaunchEvent {
  cudaEvent_t event = nullptr;
  ~LaunchEvent() {
    if (event) cudaEventDestroy(event);  // released by CUDA once it has passed
  }
};

// A send or receive of the NCCL group. It is queued when started and
// launched, with every other queued one, in one ncclGroupStart/End at the
// group's next wait, test, collective or blocking send/recv (so sends and
// receives in both directions progress together, as NCCL requires); it is
// done when the event recorded after that launch has passed.
class NcclP2PWork final : public CommWork {
 public:
  NcclP2PWork(std::shared_ptr<NcclGroup> group, CollectiveKind kind, Tensor t, int peer, int tag)
      : group(std::move(group)), kind(kind), t(std::move(t)), peer(peer), tag(tag), phase(current_comm_phase()) {}
  void wait() override;
  bool test() override;

  std::shared_ptr<NcclGroup> group;
  CollectiveKind kind;
  Tensor t;
  int peer, tag;
  CommPhase phase;
  std::shared_ptr<LaunchEvent> launched;  // null while queued
  bool done = false;
};

class NcclGroup final : public ProcessGroup, public std::enable_shared_from_this<NcclGroup> {
 public:
  NcclGroup(std::shared_ptr<ProcessGroup> bootstrap, int device) : bootstrap_(std::move(bootstrap)), device_(device) {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    // Rank 0 makes the id; everyone gets it over the bootstrap group.
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (bootstrap_->rank() == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    static_assert(sizeof(ncclUniqueId) % sizeof(std::int64_t) == 0);
    Tensor carrier = zeros({std::int64_t(sizeof id / sizeof(std::int64_t))}, TensorOptions(DType::i64));
    std::memcpy(carrier.raw_data(), &id, sizeof id);
    bootstrap_->broadcast(carrier, 0);
    std::memcpy(&id, carrier.raw_data(), sizeof id);
    check(ncclCommInitRank(&comm_, bootstrap_->size(), id, bootstrap_->rank()), "ncclCommInitRank");
  }
  ~NcclGroup() override {
    if (comm_) ncclCommDestroy(comm_);
  }

  int rank() const override { return bootstrap_->rank(); }
  int size() const override { return bootstrap_->size(); }

  void all_reduce(Tensor& t, ReduceOp op) override {
    flush();
    count(CollectiveKind::all_reduce, std::int64_t(t.nbytes()));
    CollectiveInFlight busy(CollectiveKind::all_reduce, std::int64_t(t.nbytes()), rank(), size());
    const ncclRedOp_t o = op == ReduceOp::max ? ncclMax : op == ReduceOp::avg ? ncclAvg : ncclSum;
    check(ncclAllReduce(t.raw_data(), t.raw_data(), std::size_t(t.numel()), nccl_type(t, "all_reduce"), o, comm_,
                        stream()),
          "all_reduce");
    wait("all_reduce");
    t.bump_version();
  }

  Tensor all_gather(const Tensor& t_in) override {
    Tensor t = t_in.contiguous();
    Shape s = t.sizes();
    REMAT_CHECK(!s.empty(), ShapeError, "all_gather: needs at least one dim");
    s[0] *= size();
    Tensor out = empty(s, TensorOptions(t.dtype(), t.device()));
    flush();
    count(CollectiveKind::all_gather, std::int64_t(t.nbytes()));
    CollectiveInFlight busy(CollectiveKind::all_gather, std::int64_t(t.nbytes()), rank(), size());
    check(ncclAllGather(t.raw_data(), out.raw_data(), std::size_t(t.numel()), nccl_type(t, "all_gather"), comm_,
                        stream()),
          "all_gather");
    wait("all_gather");
    return out;
  }

  Tensor reduce_scatter(const Tensor& t_in, ReduceOp op) override {
    Tensor t = t_in.contiguous();
    REMAT_CHECK(t.dim() >= 1 && t.size(0) % size() == 0, ShapeError, "reduce_scatter: dim 0 of ",
                shape_str(t.sizes()), " must divide by the group size ", size());
    Shape s = t.sizes();
    s[0] /= size();
    Tensor out = empty(s, TensorOptions(t.dtype(), t.device()));
    flush();
    count(CollectiveKind::reduce_scatter, std::int64_t(t.nbytes()));
    CollectiveInFlight busy(CollectiveKind::reduce_scatter, std::int64_t(t.nbytes()), rank(), size());
    const ncclRedOp_t o = op == ReduceOp::max ? ncclMax : op == ReduceOp::avg ? ncclAvg : ncclSum;
    check(ncclReduceScatter(t.raw_data(), out.raw_data(), std::size_t(out.numel()), nccl_type(t, "reduce_scatter"), o,
                            comm_, stream()),
          "reduce_scatter");
    wait("reduce_scatter");
    return out;
  }

  // NCCL has no all-to-all-v: a group of sends and receives, one pair per peer.
  Tensor all_to_all(const Tensor& t_in, const std::vector<std::int64_t>& send_rows, std::vector<std::int64_t>& recv_rows,
                    const std::vector<std::int64_t>* known_recv_rows) override {
    Tensor t = t_in.contiguous();
    const int n = size();
    REMAT_CHECK(int(send_rows.size()) == n, ShapeError, "all_to_all: ", send_rows.size(), " send counts for a group of ", n);
    if (known_recv_rows) {
      recv_rows = *known_recv_rows;
    } else {  // counts over the bootstrap group (host memory)
      Tensor c = from_vector<std::int64_t>(send_rows, {std::int64_t(n)});
      std::vector<std::int64_t> ones(std::size_t(n), 1), got;
      recv_rows = bootstrap_->all_to_all(c, ones, got, &ones).to_vector<std::int64_t>();
    }
    std::int64_t row = 1;
    for (std::int64_t d = 1; d < t.dim(); ++d) row *= t.size(d);
    std::int64_t total = 0;
    for (auto r : recv_rows) total += r;
    Shape s = t.sizes();
    s[0] = total;
    Tensor out = empty(s, TensorOptions(t.dtype(), t.device()));
    const ncclDataType_t ty = nccl_type(t, "all_to_all");
    const std::size_t elem = element_size(t.dtype());
    flush();
    count(CollectiveKind::all_to_all, std::int64_t(t.nbytes()));
    CollectiveInFlight busy(CollectiveKind::all_to_all, std::int64_t(t.nbytes()), rank(), n);
    auto* src = static_cast<char*>(t.raw_data());
    auto* dst = static_cast<char*>(out.raw_data());
    check(ncclGroupStart(), "all_to_all (group start)");
    std::int64_t so = 0, ro = 0;
    for (int r = 0; r < n; ++r) {
      const std::int64_t sc = send_rows[std::size_t(r)] * row, rc = recv_rows[std::size_t(r)] * row;
      if (sc > 0) check(ncclSend(src + so * std::int64_t(elem), std::size_t(sc), ty, r, comm_, stream()), "all_to_all (send)");
      if (rc > 0) check(ncclRecv(dst + ro * std::int64_t(elem), std::size_t(rc), ty, r, comm_, stream()), "all_to_all (recv)");
      so += sc;
      ro += rc;
    }
    check(ncclGroupEnd(), "all_to_all (group end)");
    wait("all_to_all");
    return out;
  }

  void broadcast(Tensor& t, int root) override {
    flush();
    count(CollectiveKind::broadcast, std::int64_t(t.nbytes()));
    CollectiveInFlight busy(CollectiveKind::broadcast, std::int64_t(t.nbytes()), rank(), size());
    check(ncclBroadcast(t.raw_data(), t.raw_data(), std::size_t(t.numel()), nccl_type(t, "broadcast"), root, comm_,
                        stream()),
          "broadcast");
    wait("broadcast");
    t.bump_version();
  }

  void barrier() override {
    flush();
    bootstrap_->barrier();
  }

  std::shared_ptr<ProcessGroup> split(int color, int key) override {
    return std::make_shared<NcclGroup>(bootstrap_->split(color, key), device_);
  }

  // Bytes (ncclUint8), so every dtype travels; NCCL has no tags (the tag
  // only names the op) and does not check sizes.
  std::shared_ptr<CommWork> isend(const Tensor& t, int dst, int tag) override {
    return queue(CollectiveKind::send, t, dst, tag);
  }
  std::shared_ptr<CommWork> irecv(Tensor& t, int src, int tag) override {
    return queue(CollectiveKind::recv, t, src, tag);
  }

  // Launches the queued sends and receives as one NCCL group.
  void flush() {
    if (queued_.empty()) return;
    std::vector<std::shared_ptr<NcclP2PWork>> q;
    q.swap(queued_);
    auto launched = std::make_shared<LaunchEvent>();
    check_cuda(cudaEventCreateWithFlags(&launched->event, cudaEventDisableTiming), "cudaEventCreate");
    check(ncclGroupStart(), "send/recv (group start)");
    for (const auto& w : q) {
      // An empty tensor is agreed by both sides: nothing to exchange.
      if (w->t.nbytes() == 0) continue;
      const std::string what = p2p_name(w->kind, w->peer, w->tag, rank(), size());
      if (w->kind == CollectiveKind::send)
        check(ncclSend(w->t.raw_data(), w->t.nbytes(), ncclUint8, w->peer, comm_, stream()), what.c_str());
      else
        check(ncclRecv(w->t.raw_data(), w->t.nbytes(), ncclUint8, w->peer, comm_, stream()), what.c_str());
    }
    check(ncclGroupEnd(), "send/recv (group end)");
    check_cuda(cudaEventRecord(launched->event, stream()), "cudaEventRecord");
    for (const auto& w : q) w->launched = launched;
  }

  void wait_p2p(NcclP2PWork& w) {
    if (w.done) return;
    flush();
    launched_or_throw(w);
    CollectiveInFlight busy(w.kind, w.phase, std::int64_t(w.t.nbytes()), rank(), size(), w.peer, w.tag);
    wait(p2p_name(w.kind, w.peer, w.tag, rank(), size()).c_str(), w.launched->event);
    finish_p2p(w);
  }

  bool test_p2p(NcclP2PWork& w) {
    if (w.done) return true;
    flush();
    launched_or_throw(w);
    const cudaError_t q = cudaEventQuery(w.launched->event);
    if (q == cudaErrorNotReady) return false;
    check_cuda(q, p2p_name(w.kind, w.peer, w.tag, rank(), size()).c_str());
    finish_p2p(w);
    return true;
  }

 private:
  static cudaStream_t stream() { return cudaStreamLegacy; }

  std::shared_ptr<CommWork> queue(CollectiveKind kind, const Tensor& t, int peer, int tag) {
    check_p2p(kind, t, peer, tag, cuda_device(device_), "the NCCL group");
    count(kind, std::int64_t(t.nbytes()));
    auto w = std::make_shared<NcclP2PWork>(shared_from_this(), kind, t, peer, tag);
    queued_.push_back(w);
    return w;
  }

  // A launch that failed (its error was raised then) leaves its works unlaunched.
  void launched_or_throw(const NcclP2PWork& w) const {
    REMAT_CHECK(w.launched, Error, p2p_name(w.kind, w.peer, w.tag, rank(), size()),
                ": never launched (the NCCL launch of the queued sends and receives failed earlier)");
  }

  static void finish_p2p(NcclP2PWork& w) {
    w.done = true;
    if (w.kind == CollectiveKind::recv) w.t.bump_version();
  }

  void check(ncclResult_t rc, const char* what) const {
    if (rc == ncclSuccess || rc == ncclInProgress) return;
    throw Error(std::string("NCCL ") + what + " failed: " + ncclGetErrorString(rc) + " (" +
                (ncclGetLastError(comm_) ? ncclGetLastError(comm_) : "") + ")");
  }

  // Waits for the stream (or `event` on it), polling NCCL's asynchronous
  // errors; past the comm timeout the communicator is aborted and the
  // collective (or send / receive) named.
  void wait(const char* what, cudaEvent_t event = nullptr) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t q = event ? cudaEventQuery(event) : cudaStreamQuery(stream());
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) check_cuda(q, what);
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      // A little before the process watchdog, so the communicator is aborted
      // and the error raised here rather than the process ended.
      if (async != ncclSuccess || (comm_timeout() > 0 && waited > 0.9 * comm_timeout())) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        throw Error(std::string("NCCL ") + what + (async != ncclSuccess ? " failed asynchronously: " +
                                                                              std::string(ncclGetErrorString(async))
                                                                        : " did not finish within the comm timeout") +
                    "; a peer rank has failed or is stuck");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  std::shared_ptr<ProcessGroup> bootstrap_;
  int device_;
  ncclComm_t comm_ = nullptr;
  std::vector<std::shared_ptr<NcclP2PWork>> queued_;  // started, not yet launched
};

void NcclP2PWork::wait() { group->wait_p2p(*this); }
bool NcclP2PWork::test() { return group->test_p2p(*this); }

}  // namespace

bool nccl_available() { return true; }

std::shared_ptr<ProcessGroup> nccl_group(const std::shared_ptr<ProcessGroup>& bootstrap, int device) {
  return std::make_shared<NcclGroup>(bootstrap, device);
}

}  // namespace remat
