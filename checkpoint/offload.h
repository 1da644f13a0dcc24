// Offloading saved tensors: a saved-tensor hook that moves what ops save for
// backward out of memory after the forward and brings it back before the
// backward that needs it. Exact: the bytes come back as they left.
//
// CPU: a file-backed store. Each save is queued for writing to one spill
// file (created in OffloadOptions::dir and unlinked at once, so it vanishes
// when the process ends, however it ends) by a background thread; the
// tensor's memory is freed when its write is done. At most
// max_inflight_bytes wait to be written (the forward blocks beyond that).
// When backward unpacks a save, the thread starts reading the next ones the
// tape will need (earlier saves, newest first) up to prefetch_bytes ahead.
// A save unpacked before its write finished comes straight from memory.
//
// A failed write (a full disk, an I/O error) keeps that tensor in memory, so
// nothing is lost; from then on new saves stay in memory too, and the next
// check() or flush() on the calling thread throws IOError naming the file,
// the save and the cause (the trainer checks after every step).
//
// CUDA: device -> pinned host memory. Pack records an event on the current
// stream, makes one side stream (the hook's) wait on it and queues the copy
// there into a buffer of a pinned pool (kept by size class and reused, so a
// second step allocates none; freed with the hook), then records the copy's
// event. The device tensor stays referenced until that event has completed
// (events are polled on pack and unpack; beyond max_inflight_bytes of copies
// in flight, pack waits for the oldest), then its memory goes back to the
// caching allocator. Unpack brings saves back on the side stream (the same
// prefetch_before logic: earlier saves, newest first, up to prefetch_bytes)
// into memory allocated on the current stream, and makes the current stream
// wait on the copy's event before handing the tensor out; the host never
// blocks on a copy there. Saves of one CUDA device are taken (the first one
// seen); other devices' pass by. Every pinned buffer is used on the side
// stream only, so reuse is ordered by the stream.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "engine/autograd.h"

namespace remat {

struct OffloadOptions {
  // Directory of the spill file; empty: $TMPDIR, else /tmp.
  std::string dir;
  // Saves smaller than this stay in memory (not worth a write), unless they
  // are views into a storage of at least this size: kept, such a view would
  // keep its whole storage alive (an MoE expert's few rows of the dispatch
  // payload held all of it).
  std::size_t min_bytes = 64 * 1024;
  // Bytes queued for writing, at most; pack waits for the writer beyond it.
  std::size_t max_inflight_bytes = std::size_t(64) << 20;
  // How far ahead of backward the reads run, in bytes.
  std::size_t prefetch_bytes = std::size_t(2) << 20;
  // 0: unlimited. Else the store holds at most this many bytes, and a write
  // past it fails as on a full disk (ENOSPC) (tests use it).
  std::size_t capacity_bytes = 0;
  // CPU: write each save when it is packed and read each prefetch when it is
  // asked for, on the calling thread (the I/O thread stays idle), so when
  // memory is freed and taken no longer depends on the thread's timing. The
  // meta device's offload is this (docs/META.md); slower, for exact memory
  // comparisons (REMAT_OFFLOAD_SYNC=1 sets it for plans: docs/REFERENCE.md).
  bool synchronous = false;
};

struct OffloadStats {
  std::int64_t saves = 0;            // tensors taken
  std::int64_t bytes_taken = 0;      // their bytes (whether or not written before backward needed them)
  std::int64_t bytes_written = 0;
  std::int64_t bytes_read = 0;
  std::int64_t stored_bytes = 0;     // in the spill file now
  std::int64_t stored_peak = 0;
  std::int64_t memory_hits = 0;      // unpacked before their write was done
  std::int64_t prefetch_hits = 0;    // unpacked after their read had started
  std::int64_t sync_reads = 0;       // unpacked with no read started: read on the spot
  std::int64_t wait_ns = 0;          // time unpack waited for reads (the critical path)
  std::int64_t failed_writes = 0;
  // CUDA saves (counted in `saves` too), held in pinned host memory.
  std::int64_t device_saves = 0;
  std::int64_t bytes_to_host = 0;    // copied device -> host (counted once seen done)
  std::int64_t bytes_to_device = 0;  // copied host -> device
  std::int64_t host_bytes = 0;       // device saves held in pinned memory now
  std::int64_t host_peak = 0;
  std::int64_t pinned_bytes = 0;     // the pinned pool: buffers in use and free
  std::int64_t pinned_allocs = 0;    // pinned buffers allocated (each reused after)

  // Bytes moved off the device and back (the spill file's writes and reads,
  // CUDA's copies to and from the host): what a time estimate charges.
  std::int64_t moved_bytes() const { return bytes_written + bytes_read + bytes_to_host + bytes_to_device; }
};

class OffloadHooks final : public TypedSavedTensorHooks {
 public:
  // Creates the spill file and starts the I/O thread. Throws IOError if the
  // directory cannot take the file.
  explicit OffloadHooks(OffloadOptions options = {});
  // Stops the thread; the file goes with its descriptor.
  ~OffloadHooks() override;
  const OffloadOptions& options() const { return options_; }
  OffloadHooks(const OffloadHooks&) = delete;
  OffloadHooks& operator=(const OffloadHooks&) = delete;

  std::string name() const override { return "offload"; }
  // CPU and CUDA activation tensors (not parameters, gradients or optimizer
  // state) of at least min_bytes, or views into a storage of at least
  // min_bytes (CPU: until a write has failed; CUDA: on the
  // device of the first CUDA save). A view saved again while
  // its first save lives shares that one's copy.
  bool wants(const Tensor& t, const SaveInfo& info) const override;
  std::any pack_tensor(const Tensor& t, const SaveInfo& info) override;
  Tensor unpack_tensor(std::any packed, const SaveInfo& info) override;
  std::size_t held_bytes(const std::any&) const override { return 0; }
  void on_release(const std::any& packed, const SaveInfo& info) override;

  // Waits until every queued write (CPU) and device -> host copy (CUDA) is
  // done; throws IOError for a write that failed since the last report.
  void flush();
  // Throws IOError for a write that failed since the last report (no wait).
  void check();
  OffloadStats stats() const;
  // Bytes of the spill file held in the page cache now (mincore over the
  // file; 0 with none written or on CUDA): what offload "freed" but RAM
  // still holds. Written and read ranges are dropped from the cache, so
  // this stays near 0 where the file system honours the advice.
  std::int64_t page_cache_bytes() const;
  // Where the (unlinked) spill file was created, for messages.
  const std::string& path() const { return path_; }

  struct Entry;

 private:
  // A saved view: storage, offset, shape, strides and version.
  struct Key {
    const void* storage = nullptr;
    std::int64_t offset = 0;
    Shape sizes, strides;
    std::uint64_t version = 0;
    auto operator<=>(const Key&) const = default;
  };
  struct Job {
    std::shared_ptr<Entry> entry;
    bool read = false;  // else a write
  };

  void run();
  void throw_pending_error();  // with mu_ held
  // Counts a failed write of `e` (errno `err`; `full`: the capacity) and
  // keeps the first error for check(); with mu_ held.
  void note_failed_write(const Entry& e, int err, bool full);
  void prefetch_before(std::uint64_t seq);  // with mu_ held
  // CUDA (with mu_ held): notes finished device -> host copies (freeing the
  // device memory) and finished copies back of released saves; `wait_for`:
  // first blocks until at most that many bytes are in flight to the host.
  struct CudaSide;
  void poll_cuda(std::size_t wait_for = SIZE_MAX);
  std::any pack_cuda(const Tensor& t, const SaveInfo& info, const Key& key);
  Tensor unpack_cuda(const std::shared_ptr<Entry>& e);
  void start_copy_back(Entry& e);  // stored -> reading, on the side stream

  OffloadOptions options_;
  std::string path_;
  int fd_ = -1;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  std::map<std::uint64_t, std::shared_ptr<Entry>> live_;  // by save order
  std::map<Key, std::shared_ptr<Entry>> by_view_;         // live entries by view
  std::uint64_t next_seq_ = 0;
  std::int64_t end_ = 0;                 // bump allocator over the file
  std::size_t queued_write_bytes_ = 0;
  std::size_t prefetched_bytes_ = 0;     // read or being read, not yet unpacked
  bool busy_ = false;                    // the thread is doing I/O
  bool stop_ = false;
  std::atomic<bool> failed_{false};  // a write failed: take no more saves
  std::string pending_error_;
  OffloadStats stats_;
  std::atomic<int> cuda_index_{-1};   // the device CUDA saves are taken from
  std::unique_ptr<CudaSide> cuda_;    // made on the first CUDA save
  std::thread thread_;
};

}  // namespace remat
