#include "engine/rng.h"

#include <memory>
#include <optional>
#include <vector>

#include "engine/device_runtime.h"
#include "engine/error.h"
#include "engine/immortal.h"
#include "engine/parallel_for.h"
#include "engine/philox.h"

namespace remat {

RngState Generator::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

void Generator::set_state(RngState s) {
  std::lock_guard<std::mutex> lock(mu_);
  state_ = s;
}

void Generator::manual_seed(std::uint64_t seed) { set_state(RngState{seed, 0}); }

namespace {
thread_local std::vector<RngState>* tls_draw_log = nullptr;
thread_local RngDrawReplay::Frame tls_draw_replay;

// The replayed state of this draw, if a replay is active.
std::optional<RngState> replayed_draw() {
  RngDrawReplay::Frame& f = tls_draw_replay;
  if (!f.draws) return std::nullopt;
  REMAT_CHECK(f.next < f.draws->size(), Error, "random draws replayed for ", f.what, ": it drew more than the ",
              f.draws->size(), " draws its first run made (a call that is not deterministic cannot be computed again)");
  return (*f.draws)[f.next++];
}

RngState logged(RngState s) {
  if (tls_draw_log) tls_draw_log->push_back(s);
  return s;
}
}  // namespace

RngState Generator::reserve(std::uint64_t elements) {
  if (auto r = replayed_draw()) return *r;
  return logged(reserve_unlogged(elements));
}

RngState Generator::reserve_unlogged(std::uint64_t elements) {
  std::lock_guard<std::mutex> lock(mu_);
  RngState start = state_;
  state_.offset += philox_blocks(elements);
  return start;
}

RngDrawLog::RngDrawLog() : previous_(tls_draw_log) { tls_draw_log = &draws_; }
RngDrawLog::~RngDrawLog() { tls_draw_log = previous_; }

RngDrawReplay::RngDrawReplay(const std::vector<RngState>& draws, const char* what) : previous_(tls_draw_replay) {
  tls_draw_replay = Frame{&draws, 0, what};
}
RngDrawReplay::~RngDrawReplay() { tls_draw_replay = previous_; }

void RngDrawReplay::done() const {
  const Frame& f = tls_draw_replay;
  REMAT_CHECK(f.draws == nullptr || f.next == f.draws->size(), Error, "random draws replayed for ", f.what, ": it drew ",
              f.next, " of the ", f.draws ? f.draws->size() : 0, " draws its first run made");
}

namespace {
thread_local int tls_shard_rank = 0, tls_shard_ranks = 1;
}  // namespace

RngShardScope::RngShardScope(int rank, int ranks) : previous_rank_(tls_shard_rank), previous_ranks_(tls_shard_ranks) {
  tls_shard_rank = rank;
  tls_shard_ranks = ranks;
}

RngShardScope::~RngShardScope() {
  tls_shard_rank = previous_rank_;
  tls_shard_ranks = previous_ranks_;
}

RngState reserve_batch_draw(Generator& gen, std::uint64_t elements) {
  if (auto r = replayed_draw()) return *r;
  if (tls_shard_ranks <= 1) return logged(gen.reserve_unlogged(elements));
  const auto ranks = std::uint64_t(tls_shard_ranks), rank = std::uint64_t(tls_shard_rank);
  if (elements % 4 == 0) {  // element i of the global draw is block i / 4, lane i % 4
    RngState s = gen.reserve_unlogged(elements * ranks);
    s.offset += rank * (elements / 4);
    return logged(s);
  }
  RngState s = gen.reserve_unlogged(philox_blocks(elements) * 4 * ranks);
  s.offset += rank * philox_blocks(elements);
  return logged(s);
}

namespace {
thread_local RngStreamScope::Frame tls_stream;
std::uint64_t stream_offset(const RngStreamScope::Frame& f, std::int64_t unit) {
  return f.start.offset + std::uint64_t(f.micro * f.units + unit) * kRngStreamBlocks;
}
}  // namespace

RngStreamScope::RngStreamScope(Generator& gen, RngState start, std::int64_t micro, std::int64_t units)
    : previous_(tls_stream) {
  REMAT_CHECK(micro >= 0 && units >= 1, Error, "RngStreamScope: micro-batch ", micro, " of streams with ", units,
              " units (need micro >= 0, units >= 1)");
  tls_stream = Frame{&gen, start, micro, units, -1};
}

RngStreamScope::~RngStreamScope() { tls_stream = previous_; }

void enter_rng_stream(std::int64_t unit) {
  RngStreamScope::Frame& f = tls_stream;
  if (!f.gen) return;
  REMAT_CHECK(unit >= 0 && unit < f.units, Error, "enter_rng_stream: unit ", unit, " outside [0, ", f.units, ")");
  if (f.unit >= 0) {
    // (A recompute may have moved the generator back before that stream.)
    const std::uint64_t at = f.gen->state().offset, from = stream_offset(f, f.unit);
    const std::uint64_t used = at >= from ? at - from : 0;
    REMAT_CHECK(used <= kRngStreamBlocks, Error, "enter_rng_stream: unit ", f.unit, " of micro-batch ", f.micro,
                " drew ", used, " Philox blocks, more than its stream's ", kRngStreamBlocks);
  }
  f.unit = unit;
  f.gen->set_state(RngState{f.start.seed, stream_offset(f, unit)});
}

RngState rng_streams_end(RngState start, std::int64_t micros, std::int64_t units) {
  return RngState{start.seed, start.offset + std::uint64_t(micros * units) * kRngStreamBlocks};
}

namespace {
struct Generators {
  std::mutex mu;
  Generator cpu{0};
  Generator meta{0};  // advances as the CPU's would; draws nothing
  std::vector<std::unique_ptr<Generator>> cuda;
};
Generators& generators() {
  static detail::Immortal<Generators> g;
  return g.get();
}
}  // namespace

Generator& default_generator(Device device) {
  Generators& g = generators();
  if (device.is_cpu()) return g.cpu;
  if (device.is_meta()) return g.meta;
  std::lock_guard<std::mutex> lock(g.mu);
  REMAT_CHECK(device.index >= 0 && device.index < cuda_device_count(), DeviceError,
              "default_generator: device ", device, " is not available");
  if (g.cuda.size() <= std::size_t(device.index)) g.cuda.resize(std::size_t(device.index) + 1);
  auto& slot = g.cuda[std::size_t(device.index)];
  if (!slot) slot = std::make_unique<Generator>(0);
  return *slot;
}

void manual_seed(std::uint64_t seed) {
  Generators& g = generators();
  g.cpu.manual_seed(seed);
  g.meta.manual_seed(seed);
  std::lock_guard<std::mutex> lock(g.mu);
  const int n = cuda_device_count();
  if (g.cuda.size() < std::size_t(n)) g.cuda.resize(std::size_t(n));
  for (auto& slot : g.cuda) {
    if (!slot) slot = std::make_unique<Generator>(0);
    slot->manual_seed(seed);
  }
}

namespace {
// Calls fn(first_element, words) for every block of a draw, in parallel.
template <typename Fn>
void for_each_block(std::int64_t n, RngState state, Fn&& fn) {
  const std::int64_t blocks = (n + 3) / 4;
  parallel_for(0, blocks, 4096, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b) fn(b * 4, state.seed, state.offset + std::uint64_t(b));
  });
}
}  // namespace

void philox_fill_uniform(float* out, std::int64_t n, RngState state) {
  for_each_block(n, state, [&](std::int64_t first, std::uint64_t seed, std::uint64_t index) {
    const auto w = philox::block(seed, index);
    for (int j = 0; j < 4 && first + j < n; ++j) out[first + j] = philox::to_uniform(w.v[j]);
  });
}

void philox_fill_normal(float* out, std::int64_t n, RngState state) {
  for_each_block(n, state, [&](std::int64_t first, std::uint64_t seed, std::uint64_t index) {
    const auto z = philox::normals(philox::block(seed, index));
    for (int j = 0; j < 4 && first + j < n; ++j) out[first + j] = z[j];
  });
}

void philox_fill_words(std::uint32_t* out, std::int64_t n, RngState state) {
  for_each_block(n, state, [&](std::int64_t first, std::uint64_t seed, std::uint64_t index) {
    const auto w = philox::block(seed, index);
    for (int j = 0; j < 4 && first + j < n; ++j) out[first + j] = w.v[j];
  });
}

}  // namespace remat
