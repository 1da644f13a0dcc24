// Data and expert parallel training equal one process. Runs in one process
// (trivially) and under `mpirun -np 2` / `-np 4` (tests/parallel/mpi_test.sh).
// Every rank also computes the one-process reference on the whole global
// batch itself (a single-process group), so it can compare without moving
// the reference around.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "engine/autograd.h"
#include "models/recompute.h"
#include "ops/ops.h"
#include "parallel/grad_reducer.h"
#include "train/data.h"
#include "train/parallel_layout.h"
#include "train/trainer.h"
#include "tests/skip.h"
#include "tests/tensor_compare.h"

using namespace remat;
using remat::test::norm_rel_diff;

namespace {

ModelConfig small_moe(double capacity_factor = 0) {
  ModelConfig c = ModelConfig::named("tiny-moe");
  c.capacity_factor = capacity_factor;
  c.z_coef = 1e-3;  // exercise the global z-loss too
  return c;
}

Tensor global_batch(const ModelConfig& c, std::uint64_t seed) {
  Corpus corpus = generated_corpus(seed);
  BatchSampler s(corpus.train, c.batch, c.seq, seed + 1);
  return s.next();
}

struct RunResult {
  double loss = 0;
  std::map<std::string, Tensor> grads;  // every parameter, experts gathered
  CommCounters ep_comm;                 // the expert-parallel group's collectives
  CommCounters world_comm;
  std::int64_t metadata_saved = 0;      // bytes of count exchanges replays skipped
};

// One forward/backward of `c` on the global batch, split over `world` with
// expert-parallel degree `ep`.
RunResult run(const ModelConfig& c, const std::shared_ptr<ProcessGroup>& world, std::int64_t ep,
              const std::string& plan, bool reuse) {
  const Tensor batch = global_batch(c, 3);
  ParallelLayout layout = make_parallel_layout(world, ep, c);
  DecoderModel model(c, 11, layout.placement());
  apply_parallel_layout(model, layout, reuse);
  apply_recompute_plan(model, RecomputePlan::parse(plan, c.n_layers));
  const int W = world->size();
  std::unique_ptr<GradReducer> reducer = make_grad_reducer(layout, model.named_parameters(), 64 << 10);  // several buckets
  if (reducer) reducer->prepare();
  Tensor local = batch_shard(batch, *world);
  layout.ep_group->reset_counters();
  world->reset_counters();
  const std::int64_t saved0 = dispatch_counters().metadata_bytes_saved;
  manual_seed(5);  // dropout and random routes: the same stream for every run
  RngShardScope shard(world->rank(), W);
  auto out = model.forward_loss(local);
  out.loss.backward(W > 1 ? full({}, 1.0 / double(W)) : Tensor());
  if (reducer) reducer->finish();
  RunResult r;
  r.ep_comm = layout.ep_group->counters();
  r.world_comm = world->counters();
  r.metadata_saved = dispatch_counters().metadata_bytes_saved - saved0;
  Tensor l = from_vector<float>({float(out.loss.item())}, {1});
  world->all_reduce(l, ReduceOp::avg);
  r.loss = l.item();
  const std::int64_t per = c.experts / std::max<std::int64_t>(ep, 1);
  for (auto& [name, p] : model.named_parameters()) {
    if (!is_expert_parameter(name) || ep == 1) {
      r.grads[name] = p.grad().defined() ? p.grad().clone() : zeros(p.sizes());
      continue;
    }
    Tensor g = p.grad().defined() ? p.grad().contiguous() : zeros(p.sizes());
    Tensor all = layout.ep_group->all_gather(g);
    const std::size_t at = name.find(".experts.") + 9;
    const std::int64_t e = std::stoll(name.substr(at)) - layout.ep_group->rank() * per;
    const std::string tail = name.substr(name.find('.', at));
    for (std::int64_t j = 0; j < ep; ++j)
      r.grads[name.substr(0, at) + std::to_string(j * per + e) + tail] =
          all.narrow(0, j * p.size(0), p.size(0)).clone();
  }
  return r;
}

void check_same(const RunResult& got, const RunResult& ref, const std::string& what) {
  INFO(what);
  CHECK(std::fabs(got.loss - ref.loss) <= 1e-6 * std::fabs(ref.loss));
  REQUIRE(got.grads.size() == ref.grads.size());
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, g] : ref.grads) {
    REQUIRE(got.grads.count(name) == 1);
    const double d = test::max_rel_diff(got.grads.at(name), g);
    if (d > worst) worst = d, worst_name = name;
  }
  INFO("worst gradient " << worst_name << ": " << worst);
  // f32 gradients summed over ranks in another order than one process sums
  // them: the largest difference relative to the tensor's largest value.
  // 4 ranks, worst over ep 2/4, capacity 0/1 and the three plans: 8.3e-7 on
  // BLIS (an RMSNorm weight, a sum over each rank's tokens), 9.1e-7 with
  // REMAT_GEMM=openblas (an expert's up_proj), 9.1e-7 with eigen (q_proj); the loss is equal. The
  // figure follows the kernels' summation order (1.08e-6 was measured with
  // OpenBLAS's own threading, whose order depended on the team size).
  CHECK(worst <= 2e-6);
}

std::vector<std::int64_t> ep_degrees(int W) {
  std::vector<std::int64_t> d = {W};
  if (W == 4) d.push_back(2);
  return d;
}

}  // namespace

TEST_CASE("expert parallel equals one process for none, per_block and moe_expert", "[parallel]") {
  auto world = world_group();
  // One process would compare a run with itself.
  if (world->size() == 1) REMAT_SKIP("one process: mpi_test.sh runs it under mpirun");
  for (double cf : {0.0, 1.0}) {  // dropless, and a capacity that drops slots
    const ModelConfig c = small_moe(cf);
    for (const std::string plan : {"none", "per_block", "moe_expert"}) {
      const RunResult ref = run(c, single_process_group(), 1, plan, true);
      for (std::int64_t ep : ep_degrees(world->size()))
        check_same(run(c, world, ep, plan, true), ref,
                   "plan " + plan + ", ep " + std::to_string(ep) + ", capacity " + std::to_string(cf));
    }
  }
}

TEST_CASE("dropout masks and random routes of the ranks are one process's, sliced", "[parallel]") {
  // Each rank draws its share of the global batch's draw, so even random
  // layers give one process's loss and gradients.
  auto world = world_group();
  if (world->size() == 1) REMAT_SKIP("one process: mpi_test.sh runs it under mpirun");
  ModelConfig dense = ModelConfig::named("tiny");
  dense.dropout = 0.1;
  ModelConfig moe = small_moe();
  moe.dropout = 0.1;
  moe.random_routing = true;
  for (const std::string plan : {"none", "per_block"}) {
    check_same(run(dense, world, 1, plan, true), run(dense, single_process_group(), 1, plan, true),
               "dropout, data parallel, plan " + plan);
    check_same(run(moe, world, world->size(), plan, true), run(moe, single_process_group(), 1, plan, true),
               "dropout and random routing, expert parallel, plan " + plan);
  }
}

TEST_CASE("replays re-send dispatch and combine with the same bytes, and reuse the exchanged counts",
          "[parallel]") {
  auto world = world_group();
  if (world->size() == 1) REMAT_SKIP("no collectives in one process: mpi_test.sh runs it under mpirun");
  const ModelConfig c = small_moe();
  const std::int64_t moe_layers = c.n_layers - c.dense_first;
  const std::int64_t ep = world->size();
  const RunResult none = run(c, world, ep, "none", true);
  const RunResult block = run(c, world, ep, "per_block", true);
  const RunResult expert = run(c, world, ep, "moe_expert", true);
  const RunResult no_reuse = run(c, world, ep, "per_block", false);
  using K = CollectiveKind;
  using P = CommPhase;
  // none: one dispatch and one combine all_to_all per MoE layer forward and
  // backward, nothing replayed.
  CHECK(none.ep_comm.calls_of(K::all_to_all, P::forward) == 2 * moe_layers);
  CHECK(none.ep_comm.calls_of(K::all_to_all, P::backward) == 2 * moe_layers);
  CHECK(none.ep_comm.calls_of(K::all_to_all, P::replay) == 0);
  // per_block: exactly one more dispatch and combine per routed block, the
  // same bytes as the forward's.
  CHECK(block.ep_comm.calls_of(K::all_to_all, P::replay) == 2 * moe_layers);
  CHECK(block.ep_comm.bytes_of(K::all_to_all, P::replay) == none.ep_comm.bytes_of(K::all_to_all, P::forward));
  CHECK(block.ep_comm.calls_of(K::all_to_all, P::forward) == none.ep_comm.calls_of(K::all_to_all, P::forward));
  // moe_expert: the expert compute is replayed from the received rows, so no
  // all_to_all runs again.
  CHECK(expert.ep_comm.calls_of(K::all_to_all, P::replay) == 0);
  // The per-expert counts are exchanged once per MoE layer in the forward
  // (over the world); with reuse the replay does not exchange them again.
  CHECK(block.world_comm.calls_of(K::all_gather, P::forward) == moe_layers);
  CHECK(block.world_comm.calls_of(K::all_gather, P::replay) == 0);
  CHECK(no_reuse.world_comm.calls_of(K::all_gather, P::replay) == moe_layers);
  CHECK(no_reuse.world_comm.bytes_of(K::all_gather, P::replay) == block.world_comm.bytes_of(K::all_gather, P::forward));
  // ... and says what that saved: exactly the bytes the exchange would have sent.
  CHECK(block.metadata_saved == no_reuse.world_comm.bytes_of(K::all_gather, P::replay));
  CHECK(no_reuse.metadata_saved == 0);
  check_same(no_reuse, block, "per_block without metadata reuse");
}

TEST_CASE("data parallel gradients equal one process", "[parallel]") {
  auto world = world_group();
  if (world->size() == 1) REMAT_SKIP("one process: mpi_test.sh runs it under mpirun");
  for (const std::string config : {"tiny", "tiny-moe"}) {
    const ModelConfig c = ModelConfig::named(config);
    for (const std::string plan : {"none", "per_block"})
      check_same(run(c, world, 1, plan, true), run(c, single_process_group(), 1, plan, true),
                 "data parallel " + config + ", plan " + plan);
  }
}

TEST_CASE("data parallel on shards of the batch equals one process after 5 steps", "[parallel]") {
  auto world = world_group();
  if (world->size() == 1) REMAT_SKIP("one process: mpi_test.sh runs it under mpirun");
  for (const std::string config : {"tiny", "tiny-moe"}) {
    auto train = [&](std::shared_ptr<ProcessGroup> g, std::int64_t ep) {
      TrainOptions o;
      o.config = ModelConfig::named(config);
      o.steps = 5;
      o.warmup = 2;
      o.eval_every = 0;
      o.eval_batches = 1;
      o.group = std::move(g);
      o.ep = ep;
      o.bucket_bytes = 256 << 10;
      auto t = std::make_unique<Trainer>(o);
      std::vector<double> losses;
      StepStats last;
      t->run([&](const StepStats& s) {
        losses.push_back(s.loss);
        last = s;
      });
      return std::make_tuple(std::move(t), losses, last);
    };
    auto [ref, ref_losses, ref_last] = train(single_process_group(), 1);
    const std::int64_t ep = config == "tiny-moe" ? world->size() : 1;
    for (std::int64_t e : {std::int64_t(1), ep}) {
      INFO(config << " on " << world->size() << " ranks, ep " << e);
      auto [dp, losses, last] = train(world, e);
      REQUIRE(losses.size() == 5);
      for (std::size_t i = 0; i < 5; ++i) CHECK(std::fabs(losses[i] - ref_losses[i]) <= 1e-6 * ref_losses[i]);
      double worst = 0, worst_norm = 0, diff2 = 0, norm2 = 0;
      std::string worst_name;
      for (auto& [name, p] : dp->model().named_parameters()) {
        const Tensor& q = ref->model().parameter(name);
        const double d = test::max_rel_diff(p, q);
        if (d > worst) worst = d, worst_name = name;
        const double nr = norm_rel_diff(p, q);
        worst_norm = std::max(worst_norm, nr);
        const double n = std::sqrt(double(sum(mul(q, q)).item()));
        diff2 += nr * nr * n * n;
        norm2 += n * n;
      }
      // All weights together to 1e-6 relative. Single elements can differ
      // more: AdamW divides by sqrt(v) + eps, so an element whose gradient is
      // near eps (1e-8) turns a last-bit difference of the gradient sum (the
      // ranks add their halves; one process adds all rows in one GEMM) into
      // a visible step difference. The gradients themselves agree to 1e-6
      // per tensor (the test above), and the losses at every step.
      const double global = std::sqrt(diff2 / norm2);
      INFO("all weights " << global << ", worst tensor " << worst_norm << ", worst element " << worst << " ("
                          << worst_name << ")");
      CHECK(global <= 1e-6);
      // Every rank ends with the same replicated weights, bit for bit.
      for (auto& [name, p] : dp->model().named_parameters()) {
        if (is_expert_parameter(name) && e > 1) continue;
        Tensor all = world->all_gather(p.contiguous());
        const auto v = all.to_vector<float>();
        const std::size_t n = std::size_t(p.numel());
        bool same = true;
        for (int r = 1; r < world->size(); ++r) same = same && std::equal(v.begin(), v.begin() + n, v.begin() + r * n);
        if (!same) FAIL("parameter " << name << " differs between ranks");
      }
      if (world->size() > 1 && e == 1) {
        // Gradients were reduced in several buckets; all of a dense model's
        // started while backward was still running (a MoE model's routed
        // experts wait for its end: their readiness may differ by rank).
        CHECK(last.grad_buckets > 2);
        if (config == "tiny") CHECK(last.grad_buckets_overlapped == last.grad_buckets);
        CHECK(last.grad_buckets_overlapped > 0);
      }
    }
  }
}

TEST_CASE("gradient buckets start during backward and sum over ranks", "[parallel]") {
  auto world = world_group();
  const int W = world->size();
  // Three parameters used in sequence: backward finishes w3 first.
  Tensor w1 = full({64}, 1.0), w2 = full({64}, 2.0), w3 = full({64}, 3.0);
  for (Tensor* w : {&w1, &w2, &w3}) w->set_requires_grad(true);
  GradReducer reducer({{"w1", w1, world, false}, {"w2", w2, world, false}, {"w3", w3, world, false}}, 64 * 4);
  if (W > 1) CHECK(reducer.num_buckets() == 3);
  reducer.prepare();
  Tensor x = full({64}, double(world->rank() + 1));
  Tensor y = sum(mul(mul(mul(x, w1), w2), w3));
  y.backward();
  reducer.finish();
  // d/dw1 = x * w2 * w3 = 6 * (r + 1), summed over ranks: 6 * W (W + 1) / 2.
  const double s = double(W) * double(W + 1) / 2.0;
  CHECK(w1.grad().to_vector<float>()[5] == float(6 * s));
  CHECK(w2.grad().to_vector<float>()[5] == float(3 * s));
  CHECK(w3.grad().to_vector<float>()[5] == float(2 * s));
  if (W > 1) CHECK(reducer.stats().started_in_backward == 3);
}
