// Sharded data parallel (--zero 1|2|3): the shard layout, and training
// under mpirun (tests/parallel/mpi_test.sh, 2 and 4 ranks) equal to plain
// data parallel on the same ranks: stage 1 bit for bit (the same
// all-reduce, an element-wise update, gathers that copy), stages 2 and 3 to
// 1e-5 (their gradients are reduce-scattered per unit, which adds the
// ranks' values in another order than the all-reduce, and the norm adds
// shard partials). Under stage 3 every lossless plan is bit-identical to
// none and gathers each unit once for its forward and once for its backward
// (replay included). In one process the layout and the errors run; the
// training cases skip.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <map>

#include "engine/allocator.h"
#include "ops/ops.h"
#include "parallel/shard_layout.h"
#include "tests/files.h"
#include "tests/skip.h"
#include "train/safetensors.h"
#include "train/sharded_state.h"
#include "train/state_files.h"
#include "train/trainer.h"
#include "train/zero.h"

using namespace remat;

namespace {

std::vector<float> values(const Tensor& t) { return t.contiguous().to_vector<float>(); }

}  // namespace

TEST_CASE("a unit's flat shards: pieces straddle ranks, padding is zero, pack_shard and unpack_flat invert", "[zero]") {
  const ShardLayout l = make_shard_layout("block.0", {"a", "b", "c"}, {{3, 5}, {7}, {2, 2}}, 4);
  CHECK(l.numel == 26);
  CHECK(l.shard == 7);
  CHECK(l.padded() == 28);
  auto eq = [](const ShardPiece& p, std::size_t m, std::int64_t pb, std::int64_t sb, std::int64_t n) {
    return p.member == m && p.param_begin == pb && p.shard_begin == sb && p.n == n;
  };
  REQUIRE(l.pieces(0).size() == 1);
  CHECK(eq(l.pieces(0)[0], 0, 0, 0, 7));
  REQUIRE(l.pieces(2).size() == 2);
  CHECK(eq(l.pieces(2)[0], 0, 14, 0, 1));
  CHECK(eq(l.pieces(2)[1], 1, 0, 1, 6));
  REQUIRE(l.pieces(3).size() == 2);
  CHECK(eq(l.pieces(3)[0], 1, 6, 0, 1));
  CHECK(eq(l.pieces(3)[1], 2, 0, 1, 4));  // then 2 elements of padding
  // Members -> each rank's shard -> the concatenation -> members again.
  std::vector<Tensor> members = {arange(15, DType::f32).view({3, 5}), add(arange(7, DType::f32), 100.0),
                                 add(arange(4, DType::f32), 200.0).view({2, 2})};
  std::vector<Tensor> shards;
  for (int r = 0; r < 4; ++r) {
    Tensor s = full({7}, -1.0);
    pack_shard(l, r, members, s);
    shards.push_back(s);
  }
  CHECK(values(shards[3]) == std::vector<float>{106, 200, 201, 202, 203, 0, 0});
  Tensor flat = cat(shards, 0);
  std::vector<Tensor> back = {zeros({3, 5}), zeros({7}), zeros({2, 2})};
  unpack_flat(l, flat, back);
  for (int k = 0; k < 3; ++k) CHECK(values(back[std::size_t(k)]) == values(members[std::size_t(k)]));
  // More ranks than elements: the last ranks hold padding only.
  const ShardLayout tiny = make_shard_layout("head", {"norm"}, {{2}}, 4);
  CHECK(tiny.shard == 1);
  CHECK(tiny.pieces(2).empty());
  CHECK_THROWS_WITH(make_shard_layout("x", {}, {}, 2), Catch::Contains("unit 'x'"));
  Tensor wrong = zeros({6});
  CHECK_THROWS_WITH(pack_shard(l, 0, members, wrong), Catch::Contains("7 elements"));
}

TEST_CASE("--zero names its mistakes before any work", "[zero]") {
  TrainOptions o;
  o.config = ModelConfig::named("tiny");
  o.steps = 1;
  o.group = single_process_group();
  o.zero = 2;
  CHECK_THROWS_WITH(Trainer(o), Catch::Contains("--zero 2 shards over the data-parallel ranks, but this run has one"));
  o.zero = 3;
  o.config.tie_embeddings = true;
  CHECK_THROWS_WITH(Trainer(o), Catch::Contains("--zero 3: config tiny ties its embeddings"));
  o.zero = 4;
  CHECK_THROWS_WITH(Trainer(o), Catch::Contains("--zero 4: expected 1"));
  o.zero = 0;
  o.config.tie_embeddings = false;
  o.recompute = "per_block+keep_gathered@1";
  CHECK_THROWS_WITH(Trainer(o), Catch::Contains("keep_gathered keeps blocks' gathered parameters, which only --zero 3"));
}

namespace {

struct ZeroRun {
  std::vector<double> losses, norms;
  std::int64_t persistent = 0, peak = 0;
  std::vector<std::int64_t> peaks;  // per step, less what was allocated before the run (earlier runs' states)
  std::int64_t build_peak = 0;  // the most allocated while the Trainer was built
  std::map<std::string, Tensor> state;  // rank 0: the saved state (parameters, optimizer), one process's layout
  StepStats last;
};

struct RunSpec {
  std::string config = "tiny";
  std::int64_t ep = 1, zero = 0, steps = 8, stop_after = 0;
  std::string plan = "none";
  std::string save = "", resume = "";
  std::int64_t grad_accum = 1, save_every = 0;
  std::string dtype = "f32";
};

// The same folder name on every rank: rank 0's, broadcast.
std::string shared_dir(ProcessGroup& world, const std::string& tag) {
  const std::string mine = world.rank() == 0 ? remat::test::temp_dir(tag) : std::string(64, ' ');
  std::vector<std::int64_t> chars(64, 0);
  for (std::size_t i = 0; i < mine.size() && i < 64; ++i) chars[i] = mine[i];
  Tensor t = from_vector<std::int64_t>(chars, {64});
  world.broadcast(t, 0);
  std::string out;
  for (std::int64_t c : t.to_vector<std::int64_t>())
    if (c != 0) out.push_back(char(c));
  return out;
}

ZeroRun train(const RunSpec& r, std::shared_ptr<ProcessGroup> group) {
  TrainOptions o;
  o.config = ModelConfig::named(r.config);
  o.steps = r.steps;
  o.stop_after = r.stop_after;
  o.warmup = 2;
  o.eval_every = 0;
  o.eval_batches = 1;
  o.group = std::move(group);
  o.ep = r.ep;
  o.zero = r.zero;
  o.recompute = r.plan;
  o.grad_accum = r.grad_accum;
  o.dtype = compute_dtype_from_name(r.dtype);
  o.save_every = r.save_every;
  o.bucket_bytes = 256 << 10;
  o.resume_dir = r.resume;
  const std::string dir = r.save.empty() ? shared_dir(*o.group, "zero") : r.save;
  o.save_dir = dir;
  CachingAllocator& alloc = allocator_for(kCPU);
  const std::int64_t before = alloc.stats().allocated_bytes;
  alloc.reset_peak();
  Trainer t(o);
  ZeroRun out;
  out.build_peak = alloc.stats().allocated_peak - before;
  t.run([&](const StepStats& s) {
    out.losses.push_back(s.loss);
    out.norms.push_back(s.grad_norm);
    out.persistent = s.persistent_bytes;
    out.peak = s.peak_allocated_bytes;
    out.peaks.push_back(s.peak_allocated_bytes - before);
    out.last = s;
  });
  if (t.rank() == 0) {
    SafetensorsFile f = load_safetensors(state_file(dir));
    complete_sharded_state(dir, f);  // (--zero: every rank's file)
    out.state = f.tensors;
  }
  return out;
}

// Bit for bit (tol 0), or within `tol` relative on every tensor (||a - b|| /
// ||b||; the worst single element, max |a - b| / max |b|, is reported: AdamW
// divides by sqrt(v) + eps, so an element whose gradient is near eps turns a
// last-bit difference of its gradient into a larger step difference), loss
// and gradient norm.
void check_equal(const ZeroRun& got, const ZeroRun& ref, double tol, const std::string& what) {
  INFO(what);
  REQUIRE(got.losses.size() == ref.losses.size());
  for (std::size_t i = 0; i < ref.losses.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(std::fabs(got.losses[i] - ref.losses[i]) <= tol * std::fabs(ref.losses[i]));
    CHECK(std::fabs(got.norms[i] - ref.norms[i]) <= tol * std::fabs(ref.norms[i]));
  }
  REQUIRE(got.state.size() == ref.state.size());
  double worst = 0, worst_element = 0;
  std::string worst_name, differs;
  for (const auto& [name, t] : ref.state) {
    REQUIRE(got.state.count(name) == 1);
    const auto a = values(got.state.at(name)), b = values(t);
    REQUIRE(a.size() == b.size());
    double d2 = 0, n2 = 0, diff = 0, scale = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      const double d = double(a[i]) - double(b[i]);
      d2 += d * d;
      n2 += double(b[i]) * double(b[i]);
      diff = std::max(diff, std::fabs(d));
      scale = std::max(scale, std::fabs(double(b[i])));
    }
    if (diff > 0 && differs.empty()) differs = name;
    const double rel = n2 > 0 ? std::sqrt(d2 / n2) : std::sqrt(d2);
    if (rel > worst) worst = rel, worst_name = name;
    worst_element = std::max(worst_element, scale > 0 ? diff / scale : diff);
  }
  INFO("worst tensor " << worst_name << ": " << worst << " (worst element " << worst_element << ")");
  if (tol == 0) {
    INFO("first tensor that differs: " << differs);
    CHECK(differs.empty());
  } else {
    CHECK(worst <= tol);
  }
}

std::vector<std::int64_t> ep_degrees(const std::string& config, int W) {
  if (config != "tiny-moe" || W < 4) return {1};
  return {1, 2};
}

}  // namespace

TEST_CASE("--zero 1 equals data parallel bit for bit and --zero 2 to 1e-5 after 8 steps", "[zero][parallel]") {
  auto world = world_group();
  if (world->size() == 1) REMAT_SKIP("one process: mpi_test.sh runs it under mpirun");
  for (const std::string config : {"tiny", "tiny-moe"}) {
    for (std::int64_t ep : ep_degrees(config, world->size())) {
      const ZeroRun dp = train({.config = config, .ep = ep}, world);
      const ZeroRun z1 = train({.config = config, .ep = ep, .zero = 1}, world);
      const ZeroRun z2 = train({.config = config, .ep = ep, .zero = 2}, world);
      const ZeroRun z3 = train({.config = config, .ep = ep, .zero = 3}, world);
      const std::string what = config + ", ep " + std::to_string(ep) + ", " + std::to_string(world->size()) + " ranks";
      check_equal(z1, dp, 0, "--zero 1 against --dp, " + what);
      check_equal(z2, dp, 1e-5, "--zero 2 against --dp, " + what);
      check_equal(z3, dp, 1e-5, "--zero 3 against --dp, " + what);
      check_equal(z3, z2, 0, "--zero 3 against --zero 2, " + what);  // the same sums, the same update
      // The optimizer state is split over the ranks (and, under stage 2, the
      // gradients): 16 bytes a parameter become 8 + 8/W (stage 1) and 4 + 12/W (stage 2).
      CHECK(z1.persistent < dp.persistent);
      CHECK(z2.persistent < z1.persistent);
      CHECK(z3.persistent < z2.persistent);
      if (config == "tiny") {
        const double W = world->size(), per_param = double(dp.persistent) / 16.0;
        CHECK(std::fabs(double(z1.persistent) - per_param * (8 + 8 / W)) <= per_param * 0.01);
        CHECK(std::fabs(double(z2.persistent) - per_param * (4 + 12 / W)) <= per_param * 0.01);
        CHECK(std::fabs(double(z3.persistent) - per_param * 16 / W) <= per_param * 0.01);
        // Stage 2: one reduce-scatter per unit (embedding, 4 blocks, head) a step.
        CHECK(z2.last.comm.calls_of(CollectiveKind::reduce_scatter, CommPhase::backward) == 6);
        CHECK(z2.last.comm.calls_of(CollectiveKind::all_reduce, CommPhase::backward) <= 1);  // (the order check)
      }
    }
  }
}

namespace {
// Bytes of one gather of each unit (this rank's shard, f32) of `config` over W ranks.
std::map<std::string, std::int64_t> shard_bytes(const std::string& config, int W) {
  std::map<std::string, std::int64_t> numel;
  DecoderModel m(ModelConfig::named(config), 0);
  for (const auto& [name, p] : m.named_parameters()) numel[shard_unit_name(name)] += p.numel();
  std::map<std::string, std::int64_t> out;
  for (const auto& [unit, n] : numel) out[unit] = (n + W - 1) / W * 4;
  return out;
}
}  // namespace

TEST_CASE("under --zero 2 and 3 lossless plans are bit-identical to none; stage 3 gathers each unit twice a step",
          "[zero][parallel]") {
  auto world = world_group();
  if (world->size() == 1) REMAT_SKIP("one process: mpi_test.sh runs it under mpirun");
  for (const std::string config : {"tiny", "tiny-moe"}) {
    const std::int64_t L = ModelConfig::named(config).n_layers;
    std::int64_t forward_bytes = 0, backward_bytes = 0;
    for (const auto& [unit, b] : shard_bytes(config, world->size())) {
      forward_bytes += b;
      if (unit != "embed") backward_bytes += b;  // (an embedding's backward needs no weight)
    }
    CommCounters stage2;  // stage 2 gathers every unit once a step too, after the update
    for (std::int64_t zero : {2, 3}) {
      const ZeroRun none = train({.config = config, .zero = zero, .steps = 3}, world);
      if (zero == 2) stage2 = none.last.comm;
      for (const std::string plan : {"none", "per_block", "chunk", "attention", "selective:mlp", "offload",
                                     "chunked_loss", "per_block+offload", "keep_gathered@1-2",
                                     "per_block+keep_gathered", "per_block:reentrant"}) {
        if (zero != 3 && plan.find("keep_gathered") != std::string::npos) continue;
        if (config == "tiny-moe" && plan == "per_block:reentrant") continue;  // (refused: router losses)
        const ZeroRun p = train({.config = config, .zero = zero, .steps = 3, .plan = plan}, world);
        const std::string what = config + " --zero " + std::to_string(zero) + ", plan " + plan;
        check_equal(p, none, 0, what);
        if (zero != 3) continue;
        INFO(what);
        // Forward: the embedding, every block and the head once each (as
        // stage 2 after its update; both also gather host scalars: the
        // loss and the norm summed in rank order, a MoE router's counts);
        // backward (replays included): every block and the head once each.
        const CommCounters& c = p.last.comm;
        const auto gathers = [&](CommPhase ph) { return c.calls_of(CollectiveKind::all_gather, ph); };
        const auto bytes = [&](CommPhase ph) { return c.bytes_of(CollectiveKind::all_gather, ph); };
        CHECK(gathers(CommPhase::forward) == stage2.calls_of(CollectiveKind::all_gather, CommPhase::forward));
        CHECK(bytes(CommPhase::forward) == stage2.bytes_of(CollectiveKind::all_gather, CommPhase::forward));
        if (config == "tiny") {
          CHECK(gathers(CommPhase::forward) == L + 2 + 2);
          CHECK(bytes(CommPhase::forward) == forward_bytes + 16);
        }
        // (keep_gathered blocks keep their forward's gather for their backward.)
        const std::int64_t kept = plan == "keep_gathered@1-2" ? 2 : plan == "per_block+keep_gathered" ? L : 0;
        CHECK(gathers(CommPhase::backward) + gathers(CommPhase::replay) == L + 1 - kept);
        if (kept == 0) CHECK(bytes(CommPhase::backward) + bytes(CommPhase::replay) == backward_bytes);
        CHECK(c.calls_of(CollectiveKind::reduce_scatter, CommPhase::backward) == L + 2);
      }
    }
  }
}

TEST_CASE("under --dtype bf16, --zero 3 gathers in bf16 what the layers cast: half the bytes, --zero 2's bits",
          "[zero][parallel]") {
  auto world = world_group();
  if (world->size() == 1) REMAT_SKIP("one process: mpi_test.sh runs it under mpirun");
  for (const std::string config : {"tiny", "tiny-moe"}) {
    INFO(config);
    const ZeroRun z2 = train({.config = config, .zero = 2, .steps = 3, .dtype = "bf16"}, world);
    const ZeroRun f32 = train({.config = config, .zero = 3, .steps = 3}, world);
    for (const std::string plan : {"none", "per_block", "selective:mlp", "keep_gathered@1-2"}) {
      const ZeroRun z3 = train({.config = config, .zero = 3, .steps = 3, .plan = plan, .dtype = "bf16"}, world);
      // The same casts of the same f32 values, made before the gather
      // instead of after it: the run is --zero 2's bit for bit.
      check_equal(z3, z2, 0, config + " bf16 --zero 3 " + plan + " against --zero 2");
      if (plan != "none") continue;
      const CommCounters& c = z3.last.comm;
      const auto bytes = [&](const CommCounters& k) {
        return k.bytes_of(CollectiveKind::all_gather, CommPhase::backward) +
               k.bytes_of(CollectiveKind::all_gather, CommPhase::replay);
      };
      if (config == "tiny") {  // every block and the head gather in bf16: half the f32 run's backward bytes
        CHECK(2 * bytes(c) == bytes(f32.last.comm));
      } else {  // MoE blocks read their router's weight as f32: only the dense block and the head halve
        CHECK(bytes(c) < bytes(f32.last.comm));
      }
      INFO("step peaks, bf16 --zero 3: " << z3.peaks[1] << ", --zero 2: " << z2.peaks[1] << ", f32 --zero 3: " << f32.peaks[1]);
      CHECK(z3.peaks[1] < f32.peaks[1]);
      // tiny: shards and bf16 gathers hold less than stage 2's whole f32
      // parameters (tiny-moe's blocks gather in f32, for their routers).
      if (config == "tiny") CHECK(z3.peaks[1] < z2.peaks[1]);
    }
  }
}

TEST_CASE("a --zero 2 state resumes under --zero 1, plain data parallel and one process", "[zero][parallel]") {
  auto world = world_group();
  if (world->size() == 1) REMAT_SKIP("one process: mpi_test.sh runs it under mpirun");
  const std::string dir = shared_dir(*world, "zero-resume");
  const ZeroRun whole = train({.config = "tiny-moe", .zero = 2}, world);
  train({.config = "tiny-moe", .zero = 2, .stop_after = 4, .save = dir}, world);
  const std::string shared = dir;
  const std::vector<double> tail(whole.losses.begin() + 4, whole.losses.end());
  for (std::int64_t zero : {1, 2, 3}) {
    const ZeroRun r = train({.config = "tiny-moe", .zero = zero, .resume = shared}, world);
    INFO("resumed under --zero " << zero);
    REQUIRE(r.losses.size() == 4);
    for (std::size_t i = 0; i < 4; ++i) CHECK(std::fabs(r.losses[i] - tail[i]) <= 1e-5 * tail[i]);
  }
  if (world->rank() == 0) {  // one process on the whole batch
    const ZeroRun r = train({.config = "tiny-moe", .resume = shared}, single_process_group());
    REQUIRE(r.losses.size() == 4);
    for (std::size_t i = 0; i < 4; ++i) CHECK(std::fabs(r.losses[i] - tail[i]) <= 1e-5 * tail[i]);
  }
  world->barrier();
}


TEST_CASE("a sharded save: one file per rank and an index; a crash at any step resumes the last complete set",
          "[zero][parallel]") {
  auto world = world_group();
  if (world->size() == 1) REMAT_SKIP("one process: mpi_test.sh runs it under mpirun");
  const int W = world->size();
  const ZeroRun whole = train({.config = "tiny", .zero = 3}, world);
  const std::string dir = shared_dir(*world, "zero-crash");
  train({.config = "tiny", .zero = 3, .stop_after = 4, .save = dir}, world);
  // The set: rank files of step 4 and an index that names them.
  for (int r = 0; r < W; ++r) CHECK(std::filesystem::exists(dir + "/shards-4/rank-" + std::to_string(r) + ".safetensors"));
  // Rank 0 copies the folder at each step of the next save (steps 5-6):
  // what a crash right there would leave behind.
  std::vector<std::pair<SaveStep, std::string>> snapshots;
  if (world->rank() == 0)
    set_save_fault_hook([&](SaveStep step) {
      const std::string snap = dir + "-at-" + save_step_name(step);
      std::filesystem::remove_all(snap);
      std::filesystem::copy(dir, snap, std::filesystem::copy_options::recursive);
      snapshots.emplace_back(step, snap);
    });
  train({.config = "tiny", .zero = 3, .stop_after = 2, .save = dir, .resume = dir}, world);
  set_save_fault_hook({});
  CHECK(std::filesystem::exists(dir + "/shards-6"));
  CHECK(std::filesystem::exists(dir + "/shards-4"));  // state.prev.safetensors (step 4) still references it
  for (SaveStep step : kSaveSteps) {
    const std::string snap = dir + "-at-" + save_step_name(step);
    INFO("a crash after save step " << save_step_name(step));
    // Before the new index replaces state.safetensors, the last complete set is step 4's.
    const bool new_set = step == SaveStep::renamed || step == SaveStep::synced;
    const ZeroRun r = train({.config = "tiny", .zero = 3, .resume = snap}, world);
    const std::size_t first = new_set ? 6 : 4;
    REQUIRE(r.losses.size() == 8 - first);
    for (std::size_t i = 0; i < r.losses.size(); ++i)
      CHECK(std::fabs(r.losses[i] - whole.losses[first + i]) <= 1e-6 * whole.losses[first + i]);
  }
  world->barrier();
  if (world->rank() == 0)
    for (SaveStep step : kSaveSteps) std::filesystem::remove_all(dir + "-at-" + save_step_name(step));
}

TEST_CASE("a sharded state with a missing or damaged rank file is refused, naming the file", "[zero][parallel]") {
  auto world = world_group();
  if (world->size() == 1) REMAT_SKIP("one process: mpi_test.sh runs it under mpirun");
  const std::string dir = shared_dir(*world, "zero-bad");
  train({.config = "tiny", .zero = 2, .stop_after = 2, .save = dir}, world);
  const std::string victim = dir + "/shards-2/rank-1.safetensors";
  if (world->rank() == 0) {  // flip a byte near the end (a tensor's data)
    std::string bytes = remat::test::read_all(victim);
    bytes[bytes.size() - 3] ^= 0x5a;
    remat::test::write_all(victim, bytes);
  }
  world->barrier();
  CHECK_THROWS_WITH(train({.config = "tiny", .zero = 2, .resume = dir}, world),
                    Catch::Contains(victim) && Catch::Contains("checksum"));
  world->barrier();
  if (world->rank() == 0) std::filesystem::remove(victim);
  world->barrier();
  CHECK_THROWS_WITH(train({.config = "tiny", .zero = 2, .resume = dir}, world),
                    Catch::Contains("rank file " + victim) && Catch::Contains("is missing"));
  world->barrier();
}

TEST_CASE("--zero 3 builds the model without the whole model on any rank, from one process's draws",
          "[zero][parallel]") {
  auto world = world_group();
  if (world->size() < 2) return;
  // tiny: 857216 f32 parameters (3.3 MiB; its largest unit, a block, 0.8
  // MiB). --zero 3 builds it on meta and each rank draws only its shards'
  // ranges of the same draws (each parameter is given a CPU home once, one
  // at a time); --dp builds it whole. The build then holds the rank's
  // persistent bytes (its shards, their gradients and AdamW's moments) and
  // less than a unit more; they train the same (stage 3 equals stage 2 bit
  // for bit: the test above), so the values are one process's.
  const std::int64_t model_bytes = 857216 * 4;
  const ZeroRun dp = train({.config = "tiny", .steps = 1}, world);
  const ZeroRun z3 = train({.config = "tiny", .zero = 3, .steps = 1}, world);
  INFO("--dp build peak " << dp.build_peak << ", --zero 3 " << z3.build_peak << " (persistent " << z3.persistent
                          << ") on " << world->size() << " ranks");
  CHECK(dp.build_peak >= model_bytes);
  CHECK(z3.build_peak <= z3.persistent + model_bytes / 4);
  const ZeroRun z2 = train({.config = "tiny", .zero = 2, .steps = 1}, world);
  CHECK(z3.losses == z2.losses);
  // Resuming reads only this rank's ranges of the state (its shards of the
  // parameters and of AdamW's moments), each verified: the same bound, from
  // a sharded state and from one process's layout (a --dp state); the whole
  // state is 3x the model.
  const std::string sharded = shared_dir(*world, "zero-resume-sharded"), whole = shared_dir(*world, "zero-resume-dp");
  train({.config = "tiny", .zero = 3, .steps = 2, .stop_after = 1, .save = sharded}, world);
  train({.config = "tiny", .steps = 2, .stop_after = 1, .save = whole}, world);
  for (const std::string& dir : {sharded, whole}) {
    INFO("resumed from " << dir);
    const ZeroRun r = train({.config = "tiny", .zero = 3, .steps = 2, .resume = dir}, world);
    INFO("resume build peak " << r.build_peak << " (persistent " << r.persistent << ")");
    REQUIRE(r.losses.size() == 1);
    CHECK(r.build_peak <= r.persistent + model_bytes / 4);
  }
}
