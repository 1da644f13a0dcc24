// A simulated rank (parallel/simulated_group.h) allocates what the real rank
// does. Under `mpirun -np 2` / `-np 4` (tests/parallel/mpi_test.sh) every
// rank records one data- or expert-parallel training step on the CPU over
// the real MPI world, then the same step on meta over simulated_world(W,
// rank), and compares the two allocator histories event for event. In one
// process the group-level checks run (shapes, counts, the split rule).
#include <catch2/catch.hpp>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/rng.h"
#include "models/decoder.h"
#include "parallel/simulated_group.h"
#include "train/data.h"
#include "train/comm_estimate.h"
#include "train/parallel_layout.h"
#include "train/zero.h"
#include "tests/skip.h"

using namespace remat;

namespace {

// The allocator's events over one step of `c` on `device`: forward, backward
// with the gradient reducer, and the reducer's end; under --zero `zero`,
// the sharded reductions, the gathers and the update too.
std::vector<MemoryEvent> record_step(const ModelConfig& c, std::shared_ptr<ProcessGroup> world, std::int64_t ep,
                                     Device device, std::int64_t zero = 0) {
  CachingAllocator& alloc = allocator_for(device);
  alloc.empty_cache();
  const ParallelLayout layout = make_parallel_layout(world, ep, c);
  manual_seed(0);
  std::unique_ptr<DecoderModel> model;
  {
    DefaultDeviceScope on(device);
    model = std::make_unique<DecoderModel>(c, 0, layout.placement());
  }
  apply_parallel_layout(*model, layout, true);
  DataParallelUpdate update =
      make_data_parallel_update(layout, model->named_parameters(), 256 << 10, zero, {}, *model);
  auto& reducer = update.reducer;  // several buckets
  ShardedGradReducer* sharded = update.zero ? update.zero->grad_reducer() : nullptr;
  Tensor global;
  if (device.is_meta()) {
    global = empty({c.batch, c.seq + 1}, TensorOptions(DType::i64, device));
  } else {
    Corpus corpus = generated_corpus(0);
    global = BatchSampler(corpus.train, c.batch, c.seq, 1).next();
  }
  alloc.enable_history(1 << 20);
  {
    Tensor batch = batch_shard(global, *world);
    if (sharded) sharded->zero();
    auto out = model->forward_loss(batch);
    if (reducer) reducer->prepare();
    if (sharded) sharded->prepare();
    out.loss.backward();
    if (reducer) reducer->finish();
    if (sharded) sharded->finish();
    if (update.zero) {
      if (update.zero->gatherer()) update.zero->gatherer()->release_all();
      update.zero->bind_grads();
      update.zero->step(1e-3);
    }
  }
  std::vector<MemoryEvent> events = alloc.history();
  alloc.enable_history(0);
  return events;
}

// "" when equal in kind, bytes, category, op and the allocated and reserved
// bytes after each event; else the first difference. The CPU's host
// bookkeeping (tagged kHostTag: on a device it is host memory, which meta
// leaves on the host) is taken out of the CPU's history first, its bytes
// from the totals after it.
std::string first_difference(const std::vector<MemoryEvent>& cpu_all, const std::vector<MemoryEvent>& meta) {
  std::vector<MemoryEvent> cpu;
  std::int64_t host_allocated = 0, host_reserved = 0;
  for (MemoryEvent e : cpu_all) {
    if (e.tag == kHostTag) {
      const std::int64_t sign = e.kind == MemoryEvent::Kind::alloc || e.kind == MemoryEvent::Kind::segment_alloc ? 1 : -1;
      (e.kind == MemoryEvent::Kind::alloc || e.kind == MemoryEvent::Kind::free ? host_allocated : host_reserved) +=
          sign * e.size;
      continue;
    }
    e.allocated_after -= host_allocated;
    e.reserved_after -= host_reserved;
    cpu.push_back(e);
  }
  if (host_allocated != 0) return "host bookkeeping still holds " + std::to_string(host_allocated) + " bytes";
  for (std::size_t i = 0; i < std::max(cpu.size(), meta.size()); ++i) {
    if (i >= cpu.size() || i >= meta.size())
      return "event " + std::to_string(i) + ": one history ends (cpu " + std::to_string(cpu.size()) + ", meta " +
             std::to_string(meta.size()) + " events)";
    const MemoryEvent &a = cpu[i], &b = meta[i];
    if (a.kind != b.kind || a.size != b.size || a.category != b.category || a.tag != b.tag ||
        a.allocated_after != b.allocated_after || a.reserved_after != b.reserved_after)
      return "event " + std::to_string(i) + ": cpu " + event_kind_name(a.kind) + " " + std::to_string(a.size) + " " +
             category_name(a.category) + " '" + a.tag + "' -> " + std::to_string(a.allocated_after) + "/" +
             std::to_string(a.reserved_after) + ", meta " + event_kind_name(b.kind) + " " + std::to_string(b.size) +
             " " + category_name(b.category) + " '" + b.tag + "' -> " + std::to_string(b.allocated_after) + "/" +
             std::to_string(b.reserved_after);
  }
  return "";
}

ModelConfig balanced_moe() {
  ModelConfig c = ModelConfig::named("tiny-moe");
  c.balanced_routing = true;
  return c;
}

}  // namespace

TEST_CASE("a simulated rank allocates what the real rank does, event for event") {
  auto world = world_group();
  const int W = world->size();
  if (W == 1) REMAT_SKIP("needs mpirun -np 2 or 4 (tests/parallel/mpi_test.sh)");
  struct Case {
    const char* name;
    ModelConfig c;
    std::int64_t ep, zero;
  };
  for (const Case& k : {Case{"tiny, dp", ModelConfig::named("tiny"), 1, 0},
                        Case{"tiny-moe balanced, dp", balanced_moe(), 1, 0},
                        Case{"tiny-moe balanced, ep", balanced_moe(), W, 0},
                        Case{"tiny, zero 1", ModelConfig::named("tiny"), 1, 1},
                        Case{"tiny, zero 2", ModelConfig::named("tiny"), 1, 2},
                        Case{"tiny, zero 3", ModelConfig::named("tiny"), 1, 3},
                        Case{"tiny-moe balanced, ep, zero 3", balanced_moe(), W, 3}}) {
    INFO(k.name << " on " << W << " ranks, rank " << world->rank());
    const auto cpu = record_step(k.c, world, k.ep, kCPU, k.zero);
    const auto meta = record_step(k.c, simulated_world(W, world->rank()), k.ep, kMeta, k.zero);
    CHECK(cpu.size() > 100);
    CHECK(first_difference(cpu, meta) == "");
  }
}

TEST_CASE("a simulated group: shapes, counts and the every-rank-alike rule") {
  auto g = simulated_world(4, 1);
  CHECK(g->rank() == 1);
  CHECK(g->size() == 4);
  Tensor m = empty({3, 5}, TensorOptions(DType::f32, kMeta));
  CHECK(g->all_gather(m).sizes() == Shape{12, 5});
  CHECK(g->reduce_scatter(empty({8, 2}, TensorOptions(DType::f32, kMeta)), ReduceOp::sum).sizes() == Shape{2, 2});
  std::vector<std::int64_t> recv;
  Tensor rows = empty({6, 4}, TensorOptions(DType::bf16, kMeta));
  CHECK(g->all_to_all(rows, {1, 2, 0, 3}, recv).sizes() == Shape{8, 4});  // 2 from each of 4 ranks
  CHECK(recv == std::vector<std::int64_t>{2, 2, 2, 2});
  CHECK(g->counters().calls_of(CollectiveKind::all_to_all, CommPhase::forward) == 2);  // counts, then rows
  CHECK(g->counters().bytes_of(CollectiveKind::all_gather, CommPhase::forward) == 60);

  // Host values: every rank holds this one's.
  Tensor v = from_vector<std::int64_t>({3, -3}, {2});
  g->all_reduce(v, ReduceOp::sum);
  CHECK(v.to_vector<std::int64_t>() == std::vector<std::int64_t>{12, -12});
  g->all_reduce(v, ReduceOp::max);
  CHECK(v.to_vector<std::int64_t>() == std::vector<std::int64_t>{12, -12});
  CHECK(g->all_gather(from_vector<float>({1.5f}, {1})).to_vector<float>() == std::vector<float>{1.5f, 1.5f, 1.5f, 1.5f});
  CHECK(g->reduce_scatter(from_vector<float>({1, 2, 3, 4}, {4}), ReduceOp::sum).to_vector<float>() ==
        std::vector<float>{8});
  std::vector<std::int64_t> r2;
  CHECK(g->all_to_all(from_vector<float>({1, 2, 3}, {3}), {1, 2, 0, 0}, r2).to_vector<float>() ==
        std::vector<float>{2, 3, 2, 3, 2, 3, 2, 3});

  // Splits by a function of the rank; split by one color cannot see the others.
  auto stage = g->split_by([](int r) { return std::pair{r % 2, -r}; });  // ranks 1, 3 by descending key
  CHECK(stage->size() == 2);
  CHECK(stage->rank() == 1);
  CHECK(simulated_world_ranks(*stage) == std::vector<int>{3, 1});
  CHECK_THROWS_WITH(g->split(0, 1), Catch::Contains("use split_by") || Catch::Contains("split_by"));

  // Sends count; a receive into host memory has no values to give.
  g->send(m, 2, 0);
  CHECK(g->counters().bytes_of(CollectiveKind::send, CommPhase::forward) == 60);
  Tensor host = empty({2}, DType::f32);
  CHECK_THROWS_WITH(g->recv(host, 0, 1), Catch::Contains("recv from rank 0") && Catch::Contains("shapes only"));
  Tensor meta_in = empty({3, 5}, TensorOptions(DType::f32, kMeta));
  g->recv(meta_in, 0, 1);
  CHECK_THROWS_WITH(simulated_world(4, 4), Catch::Contains("simulated rank 4 of 4"));
  CHECK(simulated_world_ranks(*single_process_group()).empty());
}

TEST_CASE("world specs: dp, ep, pp and zero") {
  const WorldSpec w = parse_world_spec("pp=4,dp=8");
  CHECK(w.dp == 8);
  CHECK(w.pp == 4);
  CHECK(w.ep == 1);
  CHECK(w.ranks() == 32);
  CHECK(w.str() == "dp=8,ep=1,pp=4");
  CHECK_THROWS_WITH(parse_world_spec("cp=2"), Catch::Contains("'cp=2' is not an axis") && Catch::Contains("dp=D"));
  const WorldSpec t = parse_world_spec("dp=2,tp=4,sp");
  CHECK((t.tp == 4 && t.sp && t.ranks() == 8 && t.str() == "dp=2,ep=1,pp=1,tp=4,sp"));
  CHECK_THROWS_WITH(parse_world_spec("dp=2,sp"), Catch::Contains("it needs tp >= 2"));
  CHECK_THROWS_WITH(parse_world_spec("tp=2,sp,sp"), Catch::Contains("sp is given twice"));
  CHECK_THROWS_WITH(parse_world_spec("dp=0"), Catch::Contains("dp must be a whole number >= 1"));
  CHECK_THROWS_WITH(parse_world_spec("dp=2,dp=2"), Catch::Contains("given twice"));
  CHECK_THROWS_WITH(parse_world_spec("dp=4,ep=3"), Catch::Contains("ep=3 must divide dp=4"));
  CHECK_THROWS_WITH(parse_world_spec("dp=2x"), Catch::Contains("got '2x'"));
  const WorldSpec z = parse_world_spec("dp=64,zero=3");
  CHECK(z.zero == 3);
  CHECK(z.str() == "dp=64,ep=1,pp=1,zero=3");
  CHECK_THROWS_WITH(parse_world_spec("dp=4,zero=4"), Catch::Contains("zero must be 0, 1, 2 or 3"));
  CHECK_THROWS_WITH(parse_world_spec("pp=4,zero=1"), Catch::Contains("it needs dp >= 2"));
}

TEST_CASE("the link model: ring factors, NVLink inside a node, the network across nodes") {
  const DeviceModel h200 = device_model("h200");
  REQUIRE(h200.link_bw == 450e9);
  REQUIRE(h200.network_bw == 50e9);
  REQUIRE(h200.devices_per_node == 8);
  auto world = simulated_world(16, 0);
  auto node = world->split_by([](int r) { return std::pair{r / 8, r}; });     // ranks 0-7: one node
  auto across = world->split_by([](int r) { return std::pair{r % 8, r}; });   // ranks 0 and 8: two nodes
  CHECK_FALSE(spans_nodes(*node, 8));
  CHECK(spans_nodes(*across, 8));
  CHECK_FALSE(spans_nodes(*single_process_group(), 8));  // not simulated: one node
  const double B = 1 << 20;
  Tensor mib = empty({1 << 18}, TensorOptions(DType::f32, kMeta));
  node->all_reduce(mib, ReduceOp::sum);
  CHECK(comm_seconds(*node, node->counters(), h200) == Approx(2.0 * 7 / 8 * B / 450e9 + 10e-6).epsilon(1e-12));
  (void)across->all_gather(mib);
  CHECK(comm_seconds(*across, across->counters(), h200) == Approx(1.0 * B / 50e9 + 10e-6).epsilon(1e-12));
  // A send costs its bytes; a receive only its call.
  auto pair = simulated_world(2, 0);
  pair->send(mib, 1, 0);
  pair->recv(mib, 1, 1);
  CHECK(comm_seconds(*pair, pair->counters(), h200) == Approx(B / 450e9 + 2 * 10e-6).epsilon(1e-12));
  // Only the counted difference: nothing since the snapshot costs nothing.
  CHECK(comm_seconds(*node, node->counters() - node->counters(), h200) == 0);
  CHECK(comm_seconds(*single_process_group(), CommCounters{}, h200) == 0);
}
