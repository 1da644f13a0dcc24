// The engine's random number generators: counter-based Philox4x32-10 with a
// (seed, offset) state. A draw reserves a range of Philox blocks and advances
// the offset; restoring a saved state replays exactly the same numbers, on CPU
// and on CUDA alike (see engine/philox.h for the stream layout).
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "engine/device.h"

namespace remat {

// The complete state of a generator. `offset` counts Philox blocks (4 words).
struct RngState {
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;
  friend bool operator==(const RngState&, const RngState&) = default;
};

class Generator {
 public:
  explicit Generator(std::uint64_t seed = 0) : state_{seed, 0} {}
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  RngState state() const;
  void set_state(RngState s);
  // Sets the seed and rewinds the offset to 0.
  void manual_seed(std::uint64_t seed);
  // Reserves the blocks for a draw of `elements` values and returns the state
  // the draw starts at. Thread-safe; each call gets a disjoint range. Inside
  // an RngDrawReplay it returns the replayed state instead (and advances
  // nothing); inside an RngDrawLog the state is logged.
  RngState reserve(std::uint64_t elements);
  // The same without the log and the replay (reserve_batch_draw's own
  // reservation, which logs what it returns).
  RngState reserve_unlogged(std::uint64_t elements);

 private:
  mutable std::mutex mu_;
  RngState state_;
};

// The default generator of a device (created on first use with seed 0).
Generator& default_generator(Device device = kCPU);

// Seeds the default generators of the CPU and of every CUDA device.
void manual_seed(std::uint64_t seed);

// Data parallel: inside the scope, this thread's draws over batch-major
// tensors (dropout masks, random routes) are rank `rank`'s share of a global
// batch split over `ranks`. reserve_batch_draw() then reserves the draw of the
// whole batch (ranks x elements) and returns where this rank's slice starts,
// so rank r draws the very values one process draws for the r-th 1/ranks of
// the batch (exactly when `elements` is a multiple of 4; otherwise distinct
// values per rank). Every rank's generator advances alike.
class RngShardScope {
 public:
  RngShardScope(int rank, int ranks);
  ~RngShardScope();
  RngShardScope(const RngShardScope&) = delete;
  RngShardScope& operator=(const RngShardScope&) = delete;

 private:
  int previous_rank_, previous_ranks_;
};
RngState reserve_batch_draw(Generator& gen, std::uint64_t elements);

// Schedule-independent draws (docs/ARCHITECTURE.md#the-core-engine, RNG):
// inside the scope, this thread's draws on `gen` are keyed by (micro-batch,
// unit) rather than by the order the units run in. enter_rng_stream(u) moves
// `gen` to the start of stream (micro, u): offset start.offset + (micro * units +
// u) * kRngStreamBlocks. A pipeline stage that runs block b of micro-batch m in
// its own order draws what one process draws there, and a recompute of block b
// (in that micro-batch's backward, inside the same scope) draws it again. A
// unit may draw at most 4 * kRngStreamBlocks values (Error past that).
inline constexpr std::uint64_t kRngStreamBlocks = std::uint64_t(1) << 30;
class RngStreamScope {
 public:
  // Error for micro < 0 or units < 1.
  RngStreamScope(Generator& gen, RngState start, std::int64_t micro, std::int64_t units);
  ~RngStreamScope();
  RngStreamScope(const RngStreamScope&) = delete;
  RngStreamScope& operator=(const RngStreamScope&) = delete;

  struct Frame {
    Generator* gen = nullptr;
    RngState start;
    std::int64_t micro = 0, units = 0;
    std::int64_t unit = -1;  // the stream entered last (-1: none yet)
  };

 private:
  Frame previous_;
};
// Inside an RngStreamScope: checks that the stream entered before stayed in
// its range, then moves the scope's generator to stream (micro, unit); a no-op
// outside a scope. Error for unit outside [0, units).
void enter_rng_stream(std::int64_t unit);
// Where a generator continues after `micros` micro-batches of streams
// started at `start` (the next step's start).
RngState rng_streams_end(RngState start, std::int64_t micros, std::int64_t units);

// A call's draws, logged and replayed (dynamic rematerialization computes a
// call again with the numbers it drew the first time, without moving any
// generator: checkpoint/dynamic_remat.h).
//
// RAII: logs the start state of every draw this thread reserves
// (Generator::reserve, reserve_batch_draw) while it lives; a log opened
// inside another takes the draws until it closes.
class RngDrawLog {
 public:
  RngDrawLog();
  ~RngDrawLog();
  RngDrawLog(const RngDrawLog&) = delete;
  RngDrawLog& operator=(const RngDrawLog&) = delete;
  // The logged states, in draw order.
  const std::vector<RngState>& draws() const { return draws_; }
  std::vector<RngState> take() { return std::move(draws_); }

 private:
  std::vector<RngState> draws_;
  std::vector<RngState>* previous_;
};

// RAII: this thread's draws return `draws` in order (and no generator moves)
// while it lives. A draw past the end throws Error naming `what`; draws left
// unused are checked by done().
class RngDrawReplay {
 public:
  RngDrawReplay(const std::vector<RngState>& draws, const char* what);
  ~RngDrawReplay();
  RngDrawReplay(const RngDrawReplay&) = delete;
  RngDrawReplay& operator=(const RngDrawReplay&) = delete;
  // Throws Error naming `what` unless every draw was replayed.
  void done() const;

  struct Frame {
    const std::vector<RngState>* draws = nullptr;
    std::size_t next = 0;
    const char* what = "";
  };

 private:
  Frame previous_;
};

// Philox blocks a draw of `elements` values consumes.
constexpr std::uint64_t philox_blocks(std::uint64_t elements) { return (elements + 3) / 4; }

// Fill out[0..n) from the stream at `state` on the CPU (parallel, identical
// to the CUDA kernels): uniform in [0, 1), standard normal, or raw 32-bit words.
void philox_fill_uniform(float* out, std::int64_t n, RngState state);
void philox_fill_normal(float* out, std::int64_t n, RngState state);
void philox_fill_words(std::uint32_t* out, std::int64_t n, RngState state);

}  // namespace remat
