#include "checkpoint/offload.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/allocator.h"
#include "engine/device_runtime.h"
#include "engine/error.h"

namespace remat {

struct OffloadHooks::Entry {
  using Key = OffloadHooks::Key;
  enum class State {
    queued,    // waiting for its write; data in memory
    writing,   // the thread is writing it; data in memory
    stored,    // in the file only
    reading,   // the thread is reading it back into data
    loaded,    // read back, waiting for its unpack
    memory,    // kept in memory for good (unpacked before its write, or its write failed)
    released,
  };
  std::uint64_t seq = 0;
  std::uint64_t save_id = 0;
  const char* op = "";
  Shape sizes;
  DType dtype = DType::f32;
  std::size_t nbytes = 0;
  std::int64_t offset = -1;  // in the file, once it has a place there
  Tensor data;
  State state = State::queued;
  int users = 1;             // saves sharing this entry
  Key key;
  std::weak_ptr<Storage> storage;  // the saved view's, to tell a reused address from it
  bool on_file = false;      // a complete copy is in the file
  // CUDA saves: `data` is the device tensor (while its copy to the host is
  // in flight, or copied back), `host` the pinned copy. States used: queued
  // (copy to the host in flight), stored, reading (copy back queued),
  // memory, released.
  bool cuda = false;
  // A meta save: the ideal spill file, written at once and read back when
  // the prefetch asks (no thread, no file; docs/META.md).
  bool meta = false;
  int device_index = 0;
  PinnedBuffer host;
  std::unique_ptr<Event> to_host, to_device;
  bool to_host_done = false;
  bool to_device_inflight = false;  // a copy back queued that no unpack has waited on
};

// The CUDA half: the side stream all copies run on (so every pinned buffer
// is used in that stream's order), the pinned pool and the entries whose
// copies are still watched.
struct OffloadHooks::CudaSide {
  Stream stream;  // first: destroyed last
  Event ready;    // the current stream's work so far, for the side stream to wait on
  std::multimap<std::size_t, PinnedBuffer> free_buffers;  // by size class
  std::deque<std::shared_ptr<Entry>> watch;
  std::size_t to_host_bytes = 0;  // copies to the host in flight

  // Makes the side stream wait for the work queued so far on `current`.
  void follow(StreamId current) {
    ready.record(current);
    ready.wait(stream.id());
  }
};

namespace {

std::string describe(const OffloadHooks::Entry& e) {
  return "save #" + std::to_string(e.save_id) + " of op '" + e.op + "' (" + std::to_string(e.nbytes) + " bytes)";
}

// Pinned buffers come in size classes, four per doubling above 64 KiB (at
// most a quarter wasted), so buffers are reused across saves of nearby sizes.
std::size_t size_class(std::size_t n) {
  constexpr std::size_t kMin = 64 * 1024;
  if (n <= kMin) return kMin;
  const std::size_t step = std::bit_ceil(n) / 8;
  return (n + step - 1) / step * step;
}

// An entry for a save of `t`, holding its bytes (contiguous) until they move.
std::shared_ptr<OffloadHooks::Entry> new_entry(const Tensor& t, const SaveInfo& info) {
  auto e = std::make_shared<OffloadHooks::Entry>();
  e->save_id = info.id;
  e->op = info.op;
  e->sizes = t.sizes();
  e->dtype = t.dtype();
  e->nbytes = t.nbytes();
  e->data = t.contiguous();
  e->meta = t.device().is_meta();
  return e;
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The spill file's pages leave the page cache once they are on disk (after
// a write) or back in a tensor (after a read), so the bytes offload frees
// really leave memory instead of staying cached in RAM (a CPU run would
// otherwise pay ~1% of a step and keep every byte resident). The range is
// written back first (sync_file_range waits for it), since dirty pages
// cannot be dropped. Best effort: a file system that ignores the advice
// (tmpfs) keeps them.
void drop_from_cache(int fd, std::int64_t offset, std::size_t n, bool written) {
  if (written)
    ::sync_file_range(fd, off_t(offset), off_t(n),
                      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
  ::posix_fadvise(fd, off_t(offset), off_t(n), POSIX_FADV_DONTNEED);
}

// Writes / reads all n bytes at `offset` (then drops them from the page
// cache); returns 0 or an errno.
int write_all(int fd, const char* p, std::size_t n, std::int64_t offset) {
  const std::int64_t start = offset;
  const std::size_t total = n;
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, off_t(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return ENOSPC;
    p += w;
    n -= std::size_t(w);
    offset += w;
  }
  drop_from_cache(fd, start, total, true);
  return 0;
}

int read_all(int fd, char* p, std::size_t n, std::int64_t offset) {
  const std::int64_t start = offset;
  const std::size_t total = n;
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, off_t(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) return EIO;  // the file is shorter than what was written
    p += r;
    n -= std::size_t(r);
    offset += r;
  }
  drop_from_cache(fd, start, total, false);
  return 0;
}

}  // namespace

OffloadHooks::OffloadHooks(OffloadOptions options) : options_(std::move(options)) {
  std::string dir = options_.dir;
  if (dir.empty()) {
    const char* t = std::getenv("TMPDIR");
    dir = t && *t ? t : "/tmp";
  }
  std::vector<char> templ(dir.begin(), dir.end());
  const std::string leaf = "/remat-offload-XXXXXX";
  templ.insert(templ.end(), leaf.begin(), leaf.end());
  templ.push_back('\0');
  fd_ = ::mkstemp(templ.data());
  REMAT_CHECK(fd_ >= 0, IOError, "offload: cannot create a spill file in '", dir, "': ", std::strerror(errno),
              " (set --offload-dir to a writable directory)");
  path_ = templ.data();
  ::unlink(path_.c_str());  // gone with the descriptor, however the process ends
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_RANDOM);  // no read-ahead: only the ranges read come in (and go again)
  thread_ = std::thread([this] { run(); });
}

OffloadHooks::~OffloadHooks() {
  if (cuda_) {
    try {
      cuda_->stream.synchronize();  // no copy may outlive its buffers
    } catch (const Error&) {  // a failing device: nothing more to do here
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) ::close(fd_);
}

bool OffloadHooks::wants(const Tensor& t, const SaveInfo&) const {
  if (!t.defined()) return false;
  // A small save stays, unless it is a view whose storage would stay with it.
  if (t.nbytes() < options_.min_bytes && t.impl().storage->nbytes() < options_.min_bytes) return false;
  if (t.device().is_cuda()) {
    const int index = cuda_index_.load();
    if (index >= 0 && index != t.device().index) return false;
  } else if (!(t.device().is_cpu() || t.device().is_meta()) || failed_.load()) {
    return false;
  }
  const MemoryCategory c = t.impl().storage->category();  // weights stay where they are anyway
  return c != MemoryCategory::parameter && c != MemoryCategory::gradient && c != MemoryCategory::optimizer;
}

void OffloadHooks::throw_pending_error() {
  if (pending_error_.empty()) return;
  std::string msg;
  msg.swap(pending_error_);
  throw IOError(msg);
}

std::any OffloadHooks::pack_tensor(const Tensor& t, const SaveInfo& info) {
  // The same view saved again (by two ops, or twice by one) shares its entry.
  const Key key{t.impl().storage.get(), t.storage_offset(), t.sizes(), t.strides(), t.version()};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_view_.find(key);
    // (Matched only while the first save's storage lives: a freed storage's
    // address may come back for another tensor.)
    if (it != by_view_.end() && it->second->state != Entry::State::released &&
        it->second->storage.lock() == t.impl().storage) {
      ++it->second->users;
      return it->second;
    }
  }
  if (t.device().is_cuda()) return pack_cuda(t, info, key);
  auto e = new_entry(t, info);
  std::unique_lock<std::mutex> lock(mu_);
  // Bounded memory in flight: wait for the writer.
  cv_.wait(lock, [&] { return queued_write_bytes_ == 0 || queued_write_bytes_ + e->nbytes <= options_.max_inflight_bytes; });
  e->seq = next_seq_++;
  e->offset = end_;
  end_ += std::int64_t(e->nbytes);
  queued_write_bytes_ += e->nbytes;
  ++stats_.saves;
  stats_.bytes_taken += std::int64_t(e->nbytes);
  live_.emplace(e->seq, e);
  e->key = key;
  e->storage = t.impl().storage;
  by_view_[key] = e;
  if (e->meta || options_.synchronous) {  // written at once (meta: the ideal file): the memory is free now
    queued_write_bytes_ -= e->nbytes;
    if (!e->meta) {
      const bool full = options_.capacity_bytes > 0 && std::size_t(e->offset) + e->nbytes > options_.capacity_bytes;
      const int err = full ? ENOSPC : write_all(fd_, static_cast<const char*>(e->data.raw_data()), e->nbytes, e->offset);
      if (err != 0) {
        note_failed_write(*e, err, full);
        e->state = Entry::State::memory;  // nothing is lost
        return e;
      }
    }
    e->state = Entry::State::stored;
    e->on_file = true;
    e->data = Tensor();
    stats_.bytes_written += std::int64_t(e->nbytes);
    stats_.stored_bytes += std::int64_t(e->nbytes);
    stats_.stored_peak = std::max(stats_.stored_peak, stats_.stored_bytes);
    return e;
  }
  jobs_.push_back(Job{e, false});
  lock.unlock();
  cv_.notify_all();
  return e;
}

Tensor OffloadHooks::unpack_tensor(std::any packed, const SaveInfo&) {
  const auto e = std::any_cast<std::shared_ptr<Entry>>(packed);
  std::unique_lock<std::mutex> lock(mu_);
  using S = Entry::State;
  Tensor out;
  if (e->cuda) {
    poll_cuda();
    out = unpack_cuda(e);
  } else switch (e->state) {
    case S::queued:  // not written yet: keep it in memory, skip the write
      e->state = S::memory;
      queued_write_bytes_ -= e->nbytes;
      ++stats_.memory_hits;
      out = e->data;
      cv_.notify_all();
      break;
    case S::writing:  // being written: the memory copy is as good
    case S::memory:
      ++stats_.memory_hits;
      out = e->data;
      break;
    case S::reading:
    case S::loaded: {
      ++stats_.prefetch_hits;
      const std::int64_t t0 = now_ns();
      cv_.wait(lock, [&] { return e->state != S::reading; });
      stats_.wait_ns += now_ns() - t0;
      out = e->data;
      prefetched_bytes_ -= e->nbytes;
      e->data = Tensor();
      e->state = S::stored;
      break;
    }
    case S::stored: {  // nothing started: read it here
      ++stats_.sync_reads;
      out = empty(e->sizes, TensorOptions(e->dtype, e->meta ? kMeta : kCPU));
      if (e->meta) {
        stats_.bytes_read += std::int64_t(e->nbytes);
        break;
      }
      const std::int64_t t0 = now_ns();
      const int err = read_all(fd_, static_cast<char*>(out.raw_data()), e->nbytes, e->offset);
      stats_.wait_ns += now_ns() - t0;
      REMAT_CHECK(err == 0, IOError, "offload: reading ", describe(*e), " back from ", path_, " failed: ",
                  std::strerror(err));
      stats_.bytes_read += std::int64_t(e->nbytes);
      break;
    }
    case S::released:
      throw AutogradError("offload: " + describe(*e) + " was unpacked after its release");
  }
  prefetch_before(e->seq);
  lock.unlock();
  cv_.notify_all();
  return out;
}

void OffloadHooks::prefetch_before(std::uint64_t seq) {
  using S = Entry::State;
  auto it = live_.lower_bound(seq);
  while (it != live_.begin()) {
    --it;
    Entry& p = *it->second;
    if (p.state != S::stored) continue;
    if (prefetched_bytes_ > 0 && prefetched_bytes_ + p.nbytes > options_.prefetch_bytes) break;
    if (p.cuda) {
      start_copy_back(p);
      prefetched_bytes_ += p.nbytes;
      continue;
    }
    p.data = empty(p.sizes, TensorOptions(p.dtype, p.meta ? kMeta : kCPU));  // allocated here, on the calling thread
    if (!p.meta && options_.synchronous) {  // read here, now
      if (read_all(fd_, static_cast<char*>(p.data.raw_data()), p.nbytes, p.offset) != 0) {
        p.data = Tensor();  // the unpack reads it itself, and says why if that fails too
        continue;
      }
    }
    if (p.meta || options_.synchronous) stats_.bytes_read += std::int64_t(p.nbytes);
    p.state = p.meta || options_.synchronous ? S::loaded : S::reading;  // meta: read back at once
    prefetched_bytes_ += p.nbytes;
    if (p.meta || options_.synchronous) continue;
    jobs_.push_front(Job{it->second, true});  // reads before writes: backward waits on them
  }
}

void OffloadHooks::on_release(const std::any& packed, const SaveInfo&) {
  const auto* h = std::any_cast<std::shared_ptr<Entry>>(&packed);
  if (!h) return;
  const auto& e = *h;
  std::lock_guard<std::mutex> lock(mu_);
  if (--e->users > 0) return;  // another save of the same view still needs it
  using S = Entry::State;
  if (auto it = by_view_.find(e->key); it != by_view_.end() && it->second == e) by_view_.erase(it);
  if (e->cuda) {
    // The pinned buffer goes back to the pool at once: its copies and any
    // later user's are all on the side stream, in order.
    if (e->host.data()) {
      stats_.host_bytes -= std::int64_t(e->nbytes);
      const std::size_t size = e->host.size();
      cuda_->free_buffers.emplace(size, std::move(e->host));
    }
    if (e->state == S::reading) prefetched_bytes_ -= e->nbytes;
    e->state = S::released;
    live_.erase(e->seq);
    // The device memory waits for the copies that use it.
    if (!e->to_host_done || e->to_device_inflight) {
      if (e->to_host_done) cuda_->watch.push_back(e);  // (else it is watched already)
    } else {
      e->data = Tensor();
    }
    poll_cuda();
    return;
  }
  if (e->state == S::queued) queued_write_bytes_ -= e->nbytes;
  if (e->state == S::loaded || e->state == S::reading) prefetched_bytes_ -= e->nbytes;
  if (e->on_file) stats_.stored_bytes -= std::int64_t(e->nbytes);
  // A job still queued for it sees `released` and skips it.
  if (e->state != S::writing && e->state != S::reading) e->data = Tensor();
  e->state = S::released;
  live_.erase(e->seq);
  if (live_.empty() && jobs_.empty() && !busy_) end_ = 0;  // the file is free again
  cv_.notify_all();
}

void OffloadHooks::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] {
    if (busy_) return false;
    for (const auto& j : jobs_)
      if (!j.read) return false;
    return true;
  });
  poll_cuda(0);
  throw_pending_error();
}

void OffloadHooks::check() {
  std::lock_guard<std::mutex> lock(mu_);
  throw_pending_error();
}

std::int64_t OffloadHooks::page_cache_bytes() const {
  struct stat st;
  if (fd_ < 0 || ::fstat(fd_, &st) != 0 || st.st_size <= 0) return 0;
  const std::size_t size = std::size_t(st.st_size);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd_, 0);
  if (map == MAP_FAILED) return 0;
  const std::size_t page = std::size_t(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((size + page - 1) / page);
  std::int64_t bytes = 0;
  if (::mincore(map, size, resident.data()) == 0)
    for (unsigned char r : resident) bytes += (r & 1) ? std::int64_t(page) : 0;
  ::munmap(map, size);
  return bytes;
}

OffloadStats OffloadHooks::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void OffloadHooks::note_failed_write(const Entry& e, int err, bool full) {
  ++stats_.failed_writes;
  failed_ = true;
  if (pending_error_.empty())
    pending_error_ = "offload: writing " + describe(e) + " to the spill file " + path_ + " (deleted; in " +
                     (options_.dir.empty() ? std::string("the temp folder") : options_.dir) + ") failed: " +
                     std::strerror(err) +
                     (full ? " (the store's capacity of " + std::to_string(options_.capacity_bytes) + " bytes)" : "") +
                     "; the tensor stayed in memory, nothing is lost";
}

void OffloadHooks::run() {
  using S = Entry::State;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (stop_) return;
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    Entry& e = *job.entry;
    if (!job.read) {
      if (e.state != S::queued) continue;  // unpacked or released before its turn
      e.state = S::writing;
      queued_write_bytes_ -= e.nbytes;
      const bool full = options_.capacity_bytes > 0 &&
                        std::size_t(e.offset) + e.nbytes > options_.capacity_bytes;
      Tensor src = e.data;  // keeps the bytes alive while unlocked
      busy_ = true;
      lock.unlock();
      cv_.notify_all();  // pack may go on
      const int err = full ? ENOSPC : write_all(fd_, static_cast<const char*>(src.raw_data()), e.nbytes, e.offset);
      lock.lock();
      busy_ = false;
      if (err == 0) {
        e.on_file = true;
        stats_.bytes_written += std::int64_t(e.nbytes);
        stats_.stored_bytes += std::int64_t(e.nbytes);
        stats_.stored_peak = std::max(stats_.stored_peak, stats_.stored_bytes);
        if (e.state == S::writing) {
          e.state = S::stored;
          e.data = Tensor();  // the memory is free now
        }
        if (e.state == S::released) e.data = Tensor();
        if (e.state == S::released) stats_.stored_bytes -= std::int64_t(e.nbytes);
      } else {
        note_failed_write(e, err, full);
        if (e.state == S::writing) e.state = S::memory;  // nothing is lost
        if (e.state == S::released) e.data = Tensor();
      }
    } else {
      if (e.state != S::reading) continue;
      Tensor dst = e.data;
      busy_ = true;
      lock.unlock();
      const int err = read_all(fd_, static_cast<char*>(dst.raw_data()), e.nbytes, e.offset);
      lock.lock();
      busy_ = false;
      if (err == 0) stats_.bytes_read += std::int64_t(e.nbytes);
      if (e.state == S::reading) {
        if (err == 0) {
          e.state = S::loaded;
        } else {  // let the unpack read it itself, and say why if that fails too
          e.state = S::stored;
          e.data = Tensor();
          prefetched_bytes_ -= e.nbytes;
        }
      } else if (e.state == S::released) {
        e.data = Tensor();
      }
    }
    if (live_.empty() && jobs_.empty()) end_ = 0;
    cv_.notify_all();
  }
}

std::any OffloadHooks::pack_cuda(const Tensor& t, const SaveInfo& info, const Key& key) {
  auto e = new_entry(t, info);  // (the contiguous copy is on the current stream, only for a strided view)
  e->cuda = true;
  e->device_index = t.device().index;
  const StreamId current = current_stream();
  std::lock_guard<std::mutex> lock(mu_);
  int none = -1;
  cuda_index_.compare_exchange_strong(none, t.device().index);
  if (!cuda_) cuda_ = std::make_unique<CudaSide>();
  // Bounded device memory in flight: wait for the oldest copies beyond it.
  poll_cuda(options_.max_inflight_bytes > e->nbytes ? options_.max_inflight_bytes - e->nbytes : 0);
  const std::size_t cls = size_class(e->nbytes);
  if (auto it = cuda_->free_buffers.find(cls); it != cuda_->free_buffers.end()) {
    e->host = std::move(it->second);
    cuda_->free_buffers.erase(it);
  } else {
    e->host = PinnedBuffer(cls);
    ++stats_.pinned_allocs;
    stats_.pinned_bytes += std::int64_t(cls);
  }
  const StreamId side = cuda_->stream.id();
  cuda_->follow(current);  // the copy reads what the forward produced
  copy_async(e->host.data(), e->data.raw_data(), e->nbytes, side);
  e->to_host = std::make_unique<Event>();
  e->to_host->record(side);
  cuda_->to_host_bytes += e->nbytes;
  cuda_->watch.push_back(e);
  e->seq = next_seq_++;
  ++stats_.saves;
  stats_.bytes_taken += std::int64_t(e->nbytes);
  ++stats_.device_saves;
  stats_.host_bytes += std::int64_t(e->nbytes);
  stats_.host_peak = std::max(stats_.host_peak, stats_.host_bytes);
  live_.emplace(e->seq, e);
  e->key = key;
  e->storage = t.impl().storage;
  by_view_[key] = e;
  return e;
}

void OffloadHooks::start_copy_back(Entry& e) {
  using S = Entry::State;
  // Allocated on the current stream: the side stream first waits for that
  // stream's work so far, which may still use the block's previous contents.
  e.data = empty(e.sizes, TensorOptions(e.dtype, cuda_device(e.device_index)));
  const StreamId side = cuda_->stream.id();
  cuda_->follow(current_stream());
  copy_async(e.data.raw_data(), e.host.data(), e.nbytes, side);
  if (!e.to_device) e.to_device = std::make_unique<Event>();
  e.to_device->record(side);
  e.to_device_inflight = true;
  e.state = S::reading;
  stats_.bytes_to_device += std::int64_t(e.nbytes);
}

Tensor OffloadHooks::unpack_cuda(const std::shared_ptr<Entry>& e) {
  using S = Entry::State;
  Tensor out;
  switch (e->state) {
    case S::queued:  // still being copied out: the device tensor is as good
      e->state = S::memory;  // (kept referenced by the entry until the copy is done)
      [[fallthrough]];
    case S::memory:
      ++stats_.memory_hits;
      return e->data;
    case S::stored:  // nothing started: copy it back now (no prefetch budget)
      ++stats_.sync_reads;
      start_copy_back(*e);
      prefetched_bytes_ += e->nbytes;
      break;
    case S::reading:
      ++stats_.prefetch_hits;
      break;
    case S::released:
      throw AutogradError("offload: " + describe(*e) + " was unpacked after its release");
    default:
      throw AutogradError("offload: " + describe(*e) + " is in a state CUDA saves do not use");
  }
  // Copied back on the side stream: work on the current stream waits for it
  // (the host does not).
  e->to_device->wait(current_stream());
  e->to_device_inflight = false;
  out = std::move(e->data);
  e->data = Tensor();
  prefetched_bytes_ -= e->nbytes;
  e->state = S::stored;  // the pinned copy stays until the release
  return out;
}

void OffloadHooks::poll_cuda(std::size_t wait_for) {
  if (!cuda_) return;
  using S = Entry::State;
  auto copied_out = [&](Entry& e) {
    e.to_host_done = true;
    cuda_->to_host_bytes -= e.nbytes;
    stats_.bytes_to_host += std::int64_t(e.nbytes);
    if (e.state == S::queued) e.state = S::stored;
    if (e.state == S::stored || e.state == S::released) e.data = Tensor();  // the device memory is free now
  };
  for (const auto& p : cuda_->watch) {
    if (cuda_->to_host_bytes <= wait_for) break;
    if (!p->to_host_done) {
      p->to_host->synchronize();
      copied_out(*p);
    }
  }
  auto& w = cuda_->watch;
  for (auto it = w.begin(); it != w.end();) {
    Entry& e = **it;
    if (!e.to_host_done && e.to_host->query()) copied_out(e);
    if (e.state == S::released && e.to_device_inflight && e.to_device->query()) {
      e.to_device_inflight = false;
      e.data = Tensor();
    }
    const bool keep = !e.to_host_done || (e.state == S::released && e.to_device_inflight);
    it = keep ? std::next(it) : w.erase(it);
  }
}

}  // namespace remat
