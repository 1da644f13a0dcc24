// The MPI back end of ProcessGroup (OpenMPI), for CPU tensors. Errors are
// returned (MPI_ERRORS_RETURN) and raised as remat::Error naming the
// collective (or the send / receive); MPI is finalised at exit.
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>

#include "engine/parallel_for.h"
#include "parallel/process_group.h"

namespace remat {

namespace {

std::string mpi_error(int rc, const char* what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return std::string("MPI ") + what + " failed: " + std::string(msg, std::size_t(len));
}

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw Error(mpi_error(rc, what));
}

void mpi_type_checks(const Tensor& t, const char* op) {
  REMAT_CHECK(t.device().is_cpu() && t.is_contiguous(), DeviceError, op,
              ": the MPI back end takes contiguous CPU tensors, got ", shape_str(t.sizes()), " on ", t.device());
}

MPI_Datatype mpi_type(const Tensor& t, const char* op) {
  mpi_type_checks(t, op);
  switch (t.dtype()) {
    case DType::f32: return MPI_FLOAT;
    case DType::i64: return MPI_INT64_T;
    case DType::i32: return MPI_INT32_T;
    default: throw DTypeError(std::string(op) + ": the MPI back end supports f32, i32 and i64 (and bf16, f16 in gathers), got " + dtype_name(t.dtype()));
  }
}

// For collectives that only move elements (gathers): 16-bit floats travel
// as 16-bit words (ZeRO-3 gathers in the compute dtype).
MPI_Datatype mpi_move_type(const Tensor& t, const char* op) {
  if (t.dtype() == DType::bf16 || t.dtype() == DType::f16) {
    mpi_type_checks(t, op);
    return MPI_UINT16_T;
  }
  return mpi_type(t, op);
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::max ? MPI_MAX : MPI_SUM; }

// MPI counts are ints: larger messages are refused rather than wrapped.
int mpi_count(std::int64_t n, const char* op) {
  REMAT_CHECK(n >= 0 && n <= std::int64_t(std::numeric_limits<int>::max()), ShapeError, op, ": ", n,
              " elements in one message exceed what an MPI count can hold (2^31 - 1); split the tensor");
  return int(n);
}

void divide_by(Tensor& t, int n) {
  if (t.dtype() != DType::f32 || n == 1) return;
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] /= float(n);
}

// A started MPI_Iallreduce (averages, dividing, once it is done) or
// MPI_Iallgather (`keep`: its send buffer, held until then).
class MpiWork final : public CommWork {
 public:
  MpiWork(Tensor t, int divide, int rank, int size, CollectiveKind kind = CollectiveKind::all_reduce, Tensor keep = {})
      : t_(std::move(t)), keep_(std::move(keep)), divide_(divide), rank_(rank), size_(size), kind_(kind) {}
  ~MpiWork() override {
    // Unwinding from an error: the job is about to be aborted, and waiting
    // here could block on a peer that never comes.
    if (request != MPI_REQUEST_NULL && std::uncaught_exceptions() == 0) MPI_Wait(&request, MPI_STATUS_IGNORE);
  }
  void wait() override {
    if (done_) return;
    CollectiveInFlight busy(kind_, std::int64_t(t_.nbytes()), rank_, size_);
    check(MPI_Wait(&request, MPI_STATUS_IGNORE), (std::string(collective_name(kind_)) + " (async wait)").c_str());
    finish();
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    check(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), (std::string(collective_name(kind_)) + " (async test)").c_str());
    if (flag) finish();
    return done_;
  }
  MPI_Request request = MPI_REQUEST_NULL;

 private:
  void finish() {
    if (divide_ > 1) divide_by(t_, divide_);
    t_.bump_version();
    keep_ = Tensor();
    done_ = true;
  }
  Tensor t_, keep_;
  int divide_, rank_, size_;
  CollectiveKind kind_;
  bool done_ = false;
};

bool is_truncation(int rc) {
  if (rc == MPI_SUCCESS) return false;
  int cls = 0;
  MPI_Error_class(rc, &cls);
  return cls == MPI_ERR_TRUNCATE;
}

// A started send or receive. Each message is two MPI messages with the same
// tag: an 8-byte header holding the sender's byte count, then the payload
// (the tensor's bytes, contiguous, so MPI's zero-copy paths still apply).
// MPI keeps messages between two ranks with one tag in order, so the header
// always precedes its payload; the receiver compares it with the bytes it
// expects and can name both counts even when the payload was truncated.
class MpiP2PWork final : public CommWork {
 public:
  MpiP2PWork(CollectiveKind kind, Tensor t, int peer, int tag, int rank, int size)
      : kind_(kind), t_(std::move(t)), peer_(peer), tag_(tag), rank_(rank), size_(size),
        phase_(current_comm_phase()), header_(std::make_unique<std::int64_t>(std::int64_t(t_.nbytes()))) {}
  ~MpiP2PWork() override {
    if (pending() && !failed_ && std::uncaught_exceptions() == 0) {
      for (auto& r : req_)
        if (r != MPI_REQUEST_NULL) MPI_Wait(&r, MPI_STATUS_IGNORE);
    } else if (pending()) {
      // After a failure, or unwinding from an error: the job is about to be
      // aborted and waiting could block on a peer that never comes. MPI may
      // still write into the buffers, so they are left allocated.
      static_cast<void>(new Tensor(std::move(t_)));
      static_cast<void>(header_.release());
    }
  }
  void wait() override {
    if (!error_.empty()) throw Error(error_);  // waited for again after a failure
    if (done_) return;
    CollectiveInFlight busy(kind_, phase_, std::int64_t(t_.nbytes()), rank_, size_, peer_, tag_);
    for (int i = 0; i < 2; ++i) {
      if (req_[i] == MPI_REQUEST_NULL) continue;
      MPI_Status st;
      completed(i, MPI_Wait(&req_[i], &st), st);
    }
    finish();
  }
  bool test() override {
    if (!error_.empty()) throw Error(error_);
    if (done_) return true;
    for (int i = 0; i < 2; ++i) {
      if (req_[i] == MPI_REQUEST_NULL) continue;
      int flag = 0;
      MPI_Status st;
      const int rc = MPI_Test(&req_[i], &flag, &st);
      if (rc == MPI_SUCCESS && !flag) return false;
      completed(i, rc, st);
    }
    finish();
    return true;
  }
  std::string name() const { return p2p_name(kind_, peer_, tag_, rank_, size_); }
  std::int64_t* header() { return header_.get(); }
  MPI_Request req_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // header, payload

 private:
  bool pending() const { return req_[0] != MPI_REQUEST_NULL || req_[1] != MPI_REQUEST_NULL; }

  // Request i (0 header, 1 payload) completed with `rc`.
  void completed(int i, int rc, const MPI_Status& st) {
    if (kind_ == CollectiveKind::recv && i == 1 && is_truncation(rc)) {
      truncated_ = true;  // the header says by how much (finish)
      if (req_[1] != MPI_REQUEST_NULL) MPI_Request_free(&req_[1]);  // complete, but kept by MPI after an error
      return;
    }
    if (rc != MPI_SUCCESS) fail(mpi_error(rc, (name() + (i == 0 ? " (size header)" : "")).c_str()));
    if (kind_ == CollectiveKind::recv && i == 1) MPI_Get_count(&st, MPI_BYTE, &received_);
  }

  void finish() {
    if (kind_ == CollectiveKind::recv) {
      const auto expected = std::int64_t(t_.nbytes());
      const std::int64_t sent = *header_;
      if (sent != expected || truncated_ || received_ != expected)
        fail(detail::concat(name(), ": the message from rank ", peer_, " has ",
                            sent != expected ? sent : std::int64_t(received_), " bytes but rank ", rank_, " expected ",
                            expected, " (its tensor ", shape_str(t_.sizes()), " ", dtype_name(t_.dtype()),
                            "); sender and receiver must agree on the shape and dtype"));
      t_.bump_version();
    }
    done_ = true;
  }

  // Raises `message`, and again at every later wait / test.
  [[noreturn]] void fail(std::string message) {
    failed_ = true;
    error_ = std::move(message);
    throw Error(error_);
  }

  CollectiveKind kind_;
  Tensor t_;
  int peer_, tag_, rank_, size_;
  CommPhase phase_;
  std::unique_ptr<std::int64_t> header_;  // send: this tensor's bytes; recv: the sender's
  int received_ = -1;                      // recv: payload bytes MPI delivered
  bool truncated_ = false, failed_ = false, done_ = false;
  std::string error_;  // the failure raised, if any
};

class MpiGroup final : public ProcessGroup {
 public:
  explicit MpiGroup(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    int* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &flag);
    if (flag && ub) tag_ub_ = *ub;
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(Tensor& t, ReduceOp op) override {
    count(CollectiveKind::all_reduce, std::int64_t(t.nbytes()));
    CollectiveInFlight busy(CollectiveKind::all_reduce, std::int64_t(t.nbytes()), rank_, size_);
    check(MPI_Allreduce(MPI_IN_PLACE, t.raw_data(), mpi_count(t.numel(), "all_reduce"), mpi_type(t, "all_reduce"), mpi_op(op), comm_),
          "all_reduce");
    if (op == ReduceOp::avg) divide(t);
    t.bump_version();
  }

  Tensor all_gather(const Tensor& t_in) override {
    Tensor t = t_in.contiguous();
    Shape s = t.sizes();
    REMAT_CHECK(!s.empty(), ShapeError, "all_gather: needs at least one dim");
    s[0] *= size_;
    Tensor out = empty(s, t.dtype());
    count(CollectiveKind::all_gather, std::int64_t(t.nbytes()));
    CollectiveInFlight busy(CollectiveKind::all_gather, std::int64_t(t.nbytes()), rank_, size_);
    check(MPI_Allgather(t.raw_data(), mpi_count(t.numel(), "all_gather"), mpi_move_type(t, "all_gather"),
                        out.raw_data(), mpi_count(t.numel(), "all_gather"), mpi_move_type(t, "all_gather"), comm_),
          "all_gather");
    return out;
  }

  Tensor reduce_scatter(const Tensor& t_in, ReduceOp op) override {
    Tensor t = t_in.contiguous();
    REMAT_CHECK(t.dim() >= 1 && t.size(0) % size_ == 0, ShapeError, "reduce_scatter: dim 0 of ", shape_str(t.sizes()),
                " must divide by the group size ", size_);
    Shape s = t.sizes();
    s[0] /= size_;
    Tensor out = empty(s, t.dtype());
    count(CollectiveKind::reduce_scatter, std::int64_t(t.nbytes()));
    CollectiveInFlight busy(CollectiveKind::reduce_scatter, std::int64_t(t.nbytes()), rank_, size_);
    check(MPI_Reduce_scatter_block(t.raw_data(), out.raw_data(), mpi_count(out.numel(), "reduce_scatter"), mpi_type(t, "reduce_scatter"),
                                   mpi_op(op), comm_),
          "reduce_scatter");
    if (op == ReduceOp::avg) divide(out);
    return out;
  }

  Tensor all_to_all(const Tensor& t_in, const std::vector<std::int64_t>& send_rows, std::vector<std::int64_t>& recv_rows,
                    const std::vector<std::int64_t>* known_recv_rows) override {
    Tensor t = t_in.contiguous();
    REMAT_CHECK(int(send_rows.size()) == size_, ShapeError, "all_to_all: ", send_rows.size(),
                " send counts for a group of ", size_);
    std::int64_t total = 0;
    for (auto r : send_rows) total += r;
    REMAT_CHECK(t.dim() >= 1 && total == t.size(0), ShapeError, "all_to_all: send counts add up to ", total,
                " rows but the tensor has ", t.dim() ? t.size(0) : 0);
    if (known_recv_rows) {
      recv_rows = *known_recv_rows;
    } else {
      recv_rows.assign(std::size_t(size_), 0);
      count(CollectiveKind::all_to_all, std::int64_t(size_) * 8);
      CollectiveInFlight busy(CollectiveKind::all_to_all, std::int64_t(size_) * 8, rank_, size_);
      check(MPI_Alltoall(send_rows.data(), 1, MPI_INT64_T, recv_rows.data(), 1, MPI_INT64_T, comm_),
            "all_to_all (counts)");
    }
    std::int64_t row = 1;  // elements per row (from the shape: the tensor may have no rows here)
    for (std::int64_t d = 1; d < t.dim(); ++d) row *= t.size(d);
    std::int64_t recv_total = 0;
    for (auto r : recv_rows) recv_total += r;
    Shape s = t.sizes();
    s[0] = recv_total;
    Tensor out = empty(s, t.dtype());
    const auto n = static_cast<std::size_t>(size_);
    std::vector<int> sc(n), sd(n), rc(n), rd(n);
    int so = 0, ro = 0;
    for (int r = 0; r < size_; ++r) {
      sc[std::size_t(r)] = mpi_count(send_rows[std::size_t(r)] * row, "all_to_all");
      sd[std::size_t(r)] = so;
      so = mpi_count(std::int64_t(so) + sc[std::size_t(r)], "all_to_all");
      rc[std::size_t(r)] = mpi_count(recv_rows[std::size_t(r)] * row, "all_to_all");
      rd[std::size_t(r)] = ro;
      ro = mpi_count(std::int64_t(ro) + rc[std::size_t(r)], "all_to_all");
    }
    count(CollectiveKind::all_to_all, std::int64_t(t.nbytes()));
    CollectiveInFlight busy(CollectiveKind::all_to_all, std::int64_t(t.nbytes()), rank_, size_);
    const MPI_Datatype ty = mpi_type(t, "all_to_all");
    check(MPI_Alltoallv(t.raw_data(), sc.data(), sd.data(), ty, out.raw_data(), rc.data(), rd.data(), ty, comm_),
          "all_to_all");
    return out;
  }

  void broadcast(Tensor& t, int root) override {
    count(CollectiveKind::broadcast, std::int64_t(t.nbytes()));
    CollectiveInFlight busy(CollectiveKind::broadcast, std::int64_t(t.nbytes()), rank_, size_);
    check(MPI_Bcast(t.raw_data(), mpi_count(t.numel(), "broadcast"), mpi_type(t, "broadcast"), root, comm_), "broadcast");
    t.bump_version();
  }

  void barrier() override {
    CollectiveInFlight busy(CollectiveKind::barrier, 0, rank_, size_);
    check(MPI_Barrier(comm_), "barrier");
  }

  std::shared_ptr<CommWork> all_reduce_async(Tensor& t, ReduceOp op) override {
    count(CollectiveKind::all_reduce, std::int64_t(t.nbytes()));
    auto w = std::make_shared<MpiWork>(t, op == ReduceOp::avg ? size_ : 1, rank_, size_);
    check(MPI_Iallreduce(MPI_IN_PLACE, t.raw_data(), mpi_count(t.numel(), "all_reduce"), mpi_type(t, "all_reduce"), mpi_op(op), comm_,
                         &w->request),
          "all_reduce (async)");
    return w;
  }

  std::shared_ptr<CommWork> all_gather_async(const Tensor& t_in, Tensor& out) override {
    Tensor t = t_in.contiguous();
    check_gather_output(t, out, size_);
    count(CollectiveKind::all_gather, std::int64_t(t.nbytes()));
    auto w = std::make_shared<MpiWork>(out, 1, rank_, size_, CollectiveKind::all_gather, t);
    check(MPI_Iallgather(t.raw_data(), mpi_count(t.numel(), "all_gather"), mpi_move_type(t, "all_gather"),
                         out.raw_data(), mpi_count(t.numel(), "all_gather"), mpi_move_type(t, "all_gather"), comm_,
                         &w->request),
          "all_gather (async)");
    return w;
  }

  std::shared_ptr<ProcessGroup> split(int color, int key) override {
    MPI_Comm sub;
    check(MPI_Comm_split(comm_, color, key, &sub), "split");
    return std::make_shared<MpiGroup>(sub);
  }

  std::shared_ptr<CommWork> isend(const Tensor& t, int dst, int tag) override {
    auto w = start(CollectiveKind::send, t, dst, tag);
    check(MPI_Isend(w->header(), 1, MPI_INT64_T, dst, tag, comm_, &w->req_[0]), (w->name() + " (size header)").c_str());
    check(MPI_Isend(t.raw_data(), int(t.nbytes()), MPI_BYTE, dst, tag, comm_, &w->req_[1]), w->name().c_str());
    return w;
  }

  std::shared_ptr<CommWork> irecv(Tensor& t, int src, int tag) override {
    auto w = start(CollectiveKind::recv, t, src, tag);
    check(MPI_Irecv(w->header(), 1, MPI_INT64_T, src, tag, comm_, &w->req_[0]), (w->name() + " (size header)").c_str());
    check(MPI_Irecv(t.raw_data(), int(t.nbytes()), MPI_BYTE, src, tag, comm_, &w->req_[1]), w->name().c_str());
    return w;
  }

 private:
  // Checks and counts a send or receive (before anything is posted).
  std::shared_ptr<MpiP2PWork> start(CollectiveKind kind, const Tensor& t, int peer, int tag) {
    check_p2p(kind, t, peer, tag, kCPU, "the MPI group");
    const std::string name = p2p_name(kind, peer, tag, rank_, size_);
    REMAT_CHECK(tag <= tag_ub_, Error, name, ": the tag exceeds MPI's largest, ", tag_ub_);
    REMAT_CHECK(t.nbytes() <= std::size_t(std::numeric_limits<int>::max()), ShapeError, name, ": ", t.nbytes(),
                " bytes in one message exceed what an MPI count can hold (2^31 - 1); split the tensor");
    count(kind, std::int64_t(t.nbytes()));
    return std::make_shared<MpiP2PWork>(kind, t, peer, tag, rank_, size_);
  }

  void divide(Tensor& t) const { divide_by(t, size_); }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  int tag_ub_ = 32767;  // MPI guarantees at least this
};

// Started by mpirun / srun? (OpenMPI and Slurm set these.)
bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

void abort_job(int code) {
  if (!launched_by_mpi()) return;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
}

std::shared_ptr<ProcessGroup> world_group() {
  static std::mutex mu;
  static std::shared_ptr<ProcessGroup> world;  // guarded by mu
  std::lock_guard<std::mutex> lock(mu);
  if (world) return world;
  if (!launched_by_mpi()) {
    world = single_process_group();
    return world;
  }
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    std::atexit(finalize_mpi);
    // Ranks on one machine share its cores: unless told otherwise, each
    // takes its share, so OpenMP teams do not fight over them.
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (!std::getenv("OMP_NUM_THREADS") && local && std::atoi(local) > 1)
      set_num_threads(std::max(1, int(std::thread::hardware_concurrency()) / std::atoi(local)));
  }
  world = std::make_shared<MpiGroup>(MPI_COMM_WORLD);
  return world;
}

}  // namespace remat
