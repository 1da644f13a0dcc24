#include "parallel/nccl_group.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>


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

class NcclGroup final : public ProcessGroup {
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
    count(CollectiveKind::broadcast, std::int64_t(t.nbytes()));
    CollectiveInFlight busy(CollectiveKind::broadcast, std::int64_t(t.nbytes()), rank(), size());
    check(ncclBroadcast(t.raw_data(), t.raw_data(), std::size_t(t.numel()), nccl_type(t, "broadcast"), root, comm_,
                        stream()),
          "broadcast");
    wait("broadcast");
    t.bump_version();
  }

  void barrier() override { bootstrap_->barrier(); }

  std::shared_ptr<ProcessGroup> split(int color, int key) override {
    return std::make_shared<NcclGroup>(bootstrap_->split(color, key), device_);
  }

 private:
  static cudaStream_t stream() { return cudaStreamLegacy; }

  void check(ncclResult_t rc, const char* what) const {
    if (rc == ncclSuccess || rc == ncclInProgress) return;
    throw Error(std::string("NCCL ") + what + " failed: " + ncclGetErrorString(rc) + " (" +
                (ncclGetLastError(comm_) ? ncclGetLastError(comm_) : "") + ")");
  }

  // Waits for the stream, polling NCCL's asynchronous errors; past the comm
  // timeout the communicator is aborted and the collective named.
  void wait(const char* what) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream());
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
};

}  // namespace

bool nccl_available() { return true; }

std::shared_ptr<ProcessGroup> nccl_group(const std::shared_ptr<ProcessGroup>& bootstrap, int device) {
  return std::make_shared<NcclGroup>(bootstrap, device);
}

}  // namespace remat
