// Tensor and sequence parallel training equal one process (#38). Runs under
// `mpirun -np 2` and `-np 4` (tests/parallel/mpi_test.sh): every rank trains
// the one-process reference itself (a single-process group, one thread as
// the ranks), then the job trains with --tp (x --dp), and each compares.
// Tensor parallelism changes summation order in three places — a
// row-parallel matmul adds the ranks' partial products, the vocabulary-
// parallel loss adds the ranks' sums of exp, and a sequence-parallel norm's
// weight gradient adds the ranks' sequence shards — so the comparison is
// within 1e-6 relative; every lossless plan under the same --tp/--sp equals
// `none` bit for bit.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/tensor_parallel.h"
#include "ops/ops.h"
#include "train/trainer.h"
#include "engine/allocator.h"
#include "tests/files.h"
#include "tests/parallel/fake_group.h"
#include "tests/skip.h"
#include "tests/tensor_compare.h"

using namespace remat;
using remat::test::max_rel_diff;
using remat::test::norm_rel_diff;

namespace {

ModelConfig small(const std::string& name) {
  ModelConfig c = ModelConfig::named(name == "tiny-moe" ? "tiny-moe" : "tiny");
  c.seq = 64;
  if (name == "llama-gqa-tied") {  // grouped-query attention, tied embeddings
    c.kv_heads = 2;
    c.tie_embeddings = true;
  } else if (name == "qwen2-bias") {  // one key/value head, q/k/v and o biases
    c.kv_heads = 1;
    c.qkv_bias = true;
    c.o_bias = true;
  } else if (name == "dropout") {
    c.dropout = 0.1;
  } else if (name == "tiny-moe") {
    c.random_routing = true;
  }
  c.name = name;
  return c;
}

struct Run {
  std::unique_ptr<Trainer> trainer;
  std::vector<double> losses;
  StepStats last;
  std::map<std::string, Tensor> grads;  // the last step's, whole (one process's layout)
};

// Every parameter times 1 + 1e-7 z (z standard normal): weights one
// rounding step away, so their gradients show how far rounding alone moves
// the model's own (an attention's query and key gradients cancel: a 1e-7
// change of the weights moves them 1e-4 after a few steps).
void nudge(DecoderModel& model) {
  NoGradGuard ng;
  Generator gen(7);
  for (auto& [name, p] : model.named_parameters()) p.copy_(add(p, mul(mul(p, randn(p.sizes(), DType::f32, &gen)), 1e-7)));
}

// `steps` steps (with stop_first: that many, a save to `save`, then the
// rest), or, with `resume`, from the state there to `steps`.
Run train(const ModelConfig& c, std::shared_ptr<ProcessGroup> group, std::int64_t tp, bool sp, std::int64_t ep,
          const std::string& plan, std::int64_t steps, std::int64_t stop_first = 0, const std::string& save = "",
          const std::string& resume = "", bool nudged = false, std::int64_t zero = 0) {
  TrainOptions o;
  o.config = c;
  o.steps = steps;
  o.warmup = 2;
  o.eval_every = 0;
  o.eval_batches = 1;
  o.group = group;
  o.tp = tp;
  o.sp = sp;
  o.ep = ep;
  o.recompute = plan;
  o.zero = zero;
  o.stop_after = stop_first;
  o.save_dir = save;
  o.resume_dir = resume;
  Run r;
  r.trainer = std::make_unique<Trainer>(o);
  if (nudged) nudge(r.trainer->model());
  auto step = [&](const StepStats& s) {
    r.losses.push_back(s.loss);
    r.last = s;
  };
  r.trainer->run(step);
  if (stop_first > 0) {  // the save at stop_first kept in save/first (the end overwrites save's own)
    if (group->rank() == 0) {
      std::filesystem::create_directory(save + "/first");
      std::filesystem::copy_file(save + "/state.safetensors", save + "/first/state.safetensors");
    }
    group->barrier();
    r.trainer->run(step);
  }
  const auto tp_group = r.trainer->tensor_parallel();
  for (auto& [name, p] : r.trainer->model().named_parameters()) {
    Tensor g = p.grad().defined() ? p.grad() : zeros(p.sizes());
    if (tp_group) g = tp_whole(*tp_group->group, g, tp_slice(c, name, tp_group->size(), tp_group->rank()));
    r.grads[name] = g.contiguous().clone();
  }
  return r;
}

// A fresh folder every rank of `g` names alike (rank 0's, removed at exit).
std::string shared_dir(ProcessGroup& g) {
  std::string dir = g.rank() == 0 ? test::temp_dir("tp") : std::string();
  std::vector<std::int64_t> chars(256, 0);
  for (std::size_t i = 0; i < dir.size(); ++i) chars[i] = dir[i];
  Tensor t = from_vector<std::int64_t>(chars, {256});
  g.broadcast(t, 0);
  dir.clear();
  for (std::int64_t ch : t.to_vector<std::int64_t>())
    if (ch) dir += char(ch);
  return dir;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.sizes() == b.sizes() && a.to_vector<float>() == b.to_vector<float>();
}

}  // namespace

TEST_CASE("tensor and sequence parallel training equal one process after 10 steps", "[parallel][tp]") {
  auto world = world_group();
  if (world->size() == 1) REMAT_SKIP("one process: mpi_test.sh runs it under mpirun");
  const std::int64_t W = world->size();
  for (const std::string name : {"llama-gqa-tied", "qwen2-bias", "dropout", "tiny-moe"}) {
    const ModelConfig c = small(name);
    const Run ref = train(c, single_process_group(), 1, false, 1, "none", 10);
    // tp = every rank; on 4 ranks also tp 2 x dp 2 (MoE: experts split over the two replicas).
    // On 4 ranks, tp 2 x dp 2 also under --zero 2 and 3 (sharding each slice over the replicas).
    std::vector<std::pair<std::int64_t, std::int64_t>> tps = {{W, 0}};
    if (W == 4) tps.insert(tps.end(), {{2, 0}, {2, 2}});
    if (W == 4 && !c.tie_embeddings) tps.push_back({2, 3});  // (--zero 3 refuses tied embeddings)
    for (const auto& [tp, zero] : tps)
      for (const bool sp : {false, true}) {
        const std::int64_t ep = c.experts > 0 && W / tp > 1 ? W / tp : 1;
        INFO(name << ": --tp " << tp << (sp ? " --sp" : "") << " --ep " << ep << " --zero " << zero << " on " << W
                  << " ranks");
        // 9 steps, a save (one process's layout), then the 10th step; one
        // process resumes the save and takes the same 10th step, so the
        // 10th step's gradients are compared at the same weights (AdamW's
        // first steps turn last-bit differences of near-zero gradients into
        // whole-step differences of the weights: the weights drift apart
        // within rounding, the losses stay within 1e-6). Each gradient is
        // within 2e-6 of its largest element, or within 4 times what one
        // process's own moves when its weights move by rounding (nudge).
        const std::string dir = shared_dir(*world);
        Run got = train(c, world, tp, sp, ep, "none", 10, 9, dir, "", false, zero);
        REQUIRE(got.losses.size() == 10);
        for (std::size_t i = 0; i < 10; ++i) CHECK(std::fabs(got.losses[i] - ref.losses[i]) <= 1e-6 * ref.losses[i]);
        const Run one = train(c, single_process_group(), 1, false, 1, "none", 10, 0, "", dir + "/first");
        REQUIRE(one.losses.size() == 1);
        CHECK(std::fabs(got.losses[9] - one.losses[0]) <= 1e-6 * one.losses[0]);
        if (ep > 1 || zero > 1) continue;  // (the experts' / gradients' pieces live on their ranks; the losses cover them)
        const Run rounded = train(c, single_process_group(), 1, false, 1, "none", 10, 0, "", dir + "/first", true);
        double worst = 0, d2 = 0, n2 = 0;
        std::string worst_name;
        for (const auto& [pname, g] : one.grads) {
          const double bound = std::max(2e-6, 4 * max_rel_diff(rounded.grads.at(pname), g));
          const double d = max_rel_diff(got.grads.at(pname), g) / bound;
          if (d > worst) worst = d, worst_name = pname;
          const double nr = norm_rel_diff(got.grads.at(pname), g), n = std::sqrt(double(sum(mul(g, g)).item()));
          d2 += nr * nr * n * n;
          n2 += n * n;
        }
        INFO("worst gradient " << worst_name << ": " << worst << " of its bound; all " << std::sqrt(d2 / n2));
        CHECK(worst <= 1.0);
        CHECK(std::sqrt(d2 / n2) <= 1e-6);
      }
  }
}

TEST_CASE("every lossless plan under --tp --sp equals none bit for bit; replays repeat the block collectives",
          "[parallel][tp]") {
  auto world = world_group();
  if (world->size() == 1) REMAT_SKIP("one process: mpi_test.sh runs it under mpirun");
  const ModelConfig c = small("dropout");
  const std::int64_t T = world->size();
  for (const bool sp : {false, true}) {
    const Run none = train(c, world, T, sp, 1, "none", 2);
    for (const std::string plan : {"per_block", "uniform:2", "attention", "selective:mlp", "selective:core_attn",
                                   "chunked_loss:256", "offload", "per_block+offload", "per_block:reentrant"}) {
      INFO("--tp " << T << (sp ? " --sp" : "") << ", plan " << plan);
      const Run got = train(c, world, T, sp, 1, plan, 2);
      CHECK(got.losses == none.losses);
      for (const auto& [name, g] : none.grads)
        if (!same_bits(got.grads.at(name), g)) FAIL_CHECK("gradient " << name << " differs from none's");
      const CommCounters& cc = got.last.comm;
      const auto gathers = [&](CommPhase p) { return cc.calls_of(CollectiveKind::all_gather, p); };
      const auto scatters = [&](CommPhase p) { return cc.calls_of(CollectiveKind::reduce_scatter, p); };
      const auto reduces = [&](CommPhase p) { return cc.calls_of(CollectiveKind::all_reduce, p); };
      if (plan == "per_block") {
        // Each block gathers (sp; else tp_copy) before attention and the MLP
        // and reduce-scatters (sp; else all-reduces) after them. A replay
        // repeats both gathers, and the attention's reduction: it stops early
        // after the MLP's down projection, whose reduction nothing saves.
        // Outside the blocks: the embedding's reduction, the head's gather,
        // and the gradient norm's gather of the ranks' slice squares.
        const std::int64_t L = c.n_layers;
        if (sp) {
          CHECK(gathers(CommPhase::forward) == 2 * L + 2);
          CHECK(scatters(CommPhase::forward) == 2 * L + 1);
          CHECK(gathers(CommPhase::replay) == 2 * L);
          CHECK(scatters(CommPhase::replay) == L);
        } else {
          CHECK(reduces(CommPhase::replay) == L);
          CHECK(gathers(CommPhase::replay) == 0);
        }
      }
      if (plan == "selective:core_attn") CHECK(cc.calls_in(CommPhase::replay) == 0);
      // A sub-block region repeats its gather only: its reduction is its
      // last collective, after the last op that saves anything.
      if ((plan == "attention" || plan == "selective:mlp") && sp) {
        CHECK(gathers(CommPhase::replay) == c.n_layers);
        CHECK(scatters(CommPhase::replay) == 0);
      }
    }
  }
}

TEST_CASE("under --sp a MoE block runs whole on every rank: one process's routes, metrics counted once, lossless "
          "plans equal none", "[parallel][tp]") {
  auto world = world_group();
  if (world->size() == 1) REMAT_SKIP("one process: mpi_test.sh runs it under mpirun");
  ModelConfig c = small("tiny-moe");  // random routes
  c.capacity_factor = 1.0;            // and tokens dropped: capacity needs every token of the batch
  const std::int64_t T = world->size();
  const Run one = train(c, single_process_group(), 1, false, 1, "none", 2);
  const Run none = train(c, world, T, true, 1, "none", 2);
  REQUIRE(none.last.routing.size() == one.last.routing.size());
  std::int64_t dropped = 0;
  for (std::size_t i = 0; i < one.last.routing.size(); ++i) {
    CHECK(none.last.routing[i].tokens_per_expert == one.last.routing[i].tokens_per_expert);
    CHECK(none.last.routing[i].dropped == one.last.routing[i].dropped);
    dropped += one.last.routing[i].dropped;
  }
  CHECK(dropped > 0);
  CHECK(std::fabs(none.last.aux_loss - one.last.aux_loss) <= 1e-6 * std::fabs(one.last.aux_loss));
  const auto gathers = [](const Run& r, CommPhase p) { return r.last.comm.calls_of(CollectiveKind::all_gather, p); };
  for (const std::string plan : {"per_block", "moe_expert", "selective:mlp", "selective:moe", "selective:moe_act"}) {
    INFO("--tp " << T << " --sp, plan " << plan);
    const Run got = train(c, world, T, true, 1, plan, 2);
    CHECK(got.losses == none.losses);
    CHECK(got.last.aux_loss == none.last.aux_loss);
    for (std::size_t i = 0; i < none.last.routing.size(); ++i)
      CHECK(got.last.routing[i].tokens_per_expert == none.last.routing[i].tokens_per_expert);
    for (const auto& [name, g] : none.grads)
      if (!same_bits(got.grads.at(name), g)) FAIL_CHECK("gradient " << name << " differs from none's");
    // per_block replays each block's gathers: attention's, and the MLP's or
    // the MoE block's whole sequence; the "mlp" region holds that gather,
    // the "moe" region inside it starts from the whole sequence.
    if (plan == "per_block") CHECK(gathers(got, CommPhase::replay) == 2 * c.n_layers);
    if (plan == "selective:mlp") CHECK(gathers(got, CommPhase::replay) == c.n_layers);
    if (plan == "selective:moe") CHECK(gathers(got, CommPhase::replay) == 0);
  }
}

TEST_CASE("--tp and --sp refuse what they cannot split, before any work", "[parallel][tp]") {
  ModelConfig c = ModelConfig::named("tiny");
  CHECK_THROWS_WITH(check_tensor_parallel(c, 3, false),
                    Catch::Contains("--tp 3") && Catch::Contains("4 attention heads") &&
                        Catch::Contains("FFN width 344") && Catch::Contains("vocabulary of 256"));
  CHECK_THROWS_WITH(check_tensor_parallel(c, 1, true), Catch::Contains("--sp") && Catch::Contains("--tp T with T >= 2"));
  c.kv_heads = 2;
  CHECK_NOTHROW(check_tensor_parallel(c, 4, false));  // each key/value head on two ranks
  c.kv_heads = 4;
  c.seq = 66;
  CHECK_THROWS_WITH(check_tensor_parallel(c, 4, true), Catch::Contains("sequence of 66 positions"));
  CHECK_NOTHROW(check_tensor_parallel(ModelConfig::named("tiny-moe"), 2, true));  // MoE blocks run whole
  TrainOptions o;
  o.config = ModelConfig::named("tiny");
  o.tp = 2;
  o.group = single_process_group();
  CHECK_THROWS_WITH(Trainer(o), Catch::Contains("--tp 2: the job has 1 rank(s), not a multiple of 2"));
  o.tp = 3;
  CHECK_THROWS_WITH(Trainer(o), Catch::Contains("--tp 3: config tiny does not split"));
}

TEST_CASE("a parameter's slices make the whole parameter", "[parallel][tp]") {
  const ModelConfig c = small("qwen2-bias");
  // q by heads, k/v whole heads shared by ranks (one key/value head), o and down by input.
  CHECK(tp_slice(c, "model.layers.1.self_attn.q_proj.weight", 4, 3).parts == 4);
  CHECK(tp_slice(c, "model.layers.1.self_attn.k_proj.bias", 4, 3).parts == 1);
  CHECK(tp_slice(c, "model.layers.1.self_attn.o_proj.weight", 4, 3).dim == 1);
  CHECK(!tp_slice(c, "model.layers.1.self_attn.o_proj.bias", 4, 3).split());
  CHECK(tp_slice(c, "model.layers.0.mlp.down_proj.weight", 2, 1).dim == 1);
  CHECK(tp_slice(c, "model.embed_tokens.weight", 2, 1).index == 1);
  CHECK(!tp_slice(c, "model.norm.weight", 2, 1).split());
  ModelConfig g = c;
  g.kv_heads = 2;
  const TpSlice kv = tp_slice(g, "model.layers.0.self_attn.v_proj.weight", 4, 3);
  CHECK((kv.parts == 2 && kv.index == 1 && !kv.first_holder(3, 4) && kv.first_holder(2, 4)));
  const Tensor w = randn({6, 4});
  const TpSlice row{1, 2, 1};
  CHECK(same_bits(tp_take_slice(w, row), w.narrow(1, 2, 2).contiguous()));
  CHECK(same_bits(tp_whole(*single_process_group(), w, TpSlice{}), w));
}


TEST_CASE("dropout's row pieces are one process's mask, sliced along the sequence", "[parallel][tp]") {
  // One process's [B, S, d] against two ranks' [B, S/2, d] pieces, under a
  // data-parallel shard (rank 1 of 2) as the trainer runs them.
  const Tensor x = randn({2, 8, 4});
  manual_seed(3);
  Tensor whole;
  {
    RngShardScope shard(1, 2);
    whole = dropout(x, 0.4, true);
  }
  for (std::int64_t t = 0; t < 2; ++t) {
    manual_seed(3);
    RngShardScope shard(1, 2);
    const Tensor piece = dropout(x.narrow(1, 4 * t, 4).contiguous(), 0.4, true, RowPiece{t, 2});
    CHECK(same_bits(piece, whole.narrow(1, 4 * t, 4).contiguous()));
  }
  CHECK_THROWS_WITH(dropout(randn({2, 3, 1}), 0.4, true, RowPiece{0, 2}),
                    Catch::Contains("a row piece must hold a multiple of 4 elements"));
}

TEST_CASE("a rank keeps only its slices' elements, in the parameter category", "[parallel][tp]") {
  DecoderModel model(small("llama-gqa-tied"), 11);
  auto tp = std::make_shared<TensorParallel>();
  tp->group = std::make_shared<testing::TwoRankFakeGroup>();
  const std::int64_t whole = model.num_parameters() * 4;
  const std::int64_t before = allocator_for(kCPU).stats().category(MemoryCategory::parameter);
  apply_tensor_parallel(model, tp);
  std::int64_t kept = 0, n = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    INFO(name);
    CHECK(p.impl().storage->nbytes() == p.nbytes());  // (a view of the whole would keep all of it)
    kept += std::int64_t(p.nbytes());
    ++n;
  }
  // The wholes freed, the slices kept as parameters (up to the allocator's rounding).
  const std::int64_t freed = before - allocator_for(kCPU).stats().category(MemoryCategory::parameter);
  CHECK(std::abs(freed - (whole - kept)) <= 1024 * n);
  CHECK(kept < whole * 6 / 10);
  CHECK(model.model->layers[0]->self_attn->n_heads == 2);
}
