// The block-stack interface (models/block_stack.h) on a user's model: every
// plan string gives the gradients of `none` bit for bit, block-level plans
// really checkpoint and save less, and bad plans are rejected saying why.
#include <catch2/catch.hpp>

#include <any>
#include <cstring>
#include <utility>

#include "checkpoint/checkpoint.h"
#include "checkpoint/plan.h"
#include "engine/autograd.h"
#include "models/block_stack.h"
#include "models/decoder.h"
#include "models/layers.h"
#include "models/recompute.h"
#include "ops/dropout.h"
#include "ops/loss.h"
#include "ops/ops.h"

using namespace remat;

namespace {

// x -> x + dropout(mlp(norm(x))), offering the sub-regions "norm" and "mlp".
class ResidualBlock : public Block {
 public:
  ResidualBlock(std::int64_t d, Generator& gen) {
    norm = register_module("norm", std::make_shared<RMSNorm>(d, 1e-5));
    mlp = register_module("mlp", std::make_shared<MLP>(d, 3 * d, 0.2, gen));
  }
  Tensor forward(const Tensor& x) const override {
    Tensor n = region("norm", [this](const Tensor& t) { return norm->forward(t); }, x);
    Tensor m = region("mlp", [this](const Tensor& t) { return dropout(mlp->forward(t), 0.2, training()); }, n);
    return add(x, m);
  }
  std::vector<std::string> sub_regions() const override { return {"norm", "mlp"}; }
  std::shared_ptr<RMSNorm> norm;
  std::shared_ptr<MLP> mlp;
};

constexpr std::int64_t kVocab = 32, kDim = 24, kBatch = 2, kSeq = 16;

class Net : public Module {
 public:
  explicit Net(std::int64_t blocks, std::uint64_t seed = 5) {
    Generator gen(seed);
    embed = register_module("embed", std::make_shared<Embedding>(kVocab, kDim, 0.5, gen));
    stack = register_module("blocks", std::make_shared<BlockStack>());
    for (std::int64_t i = 0; i < blocks; ++i)
      stack->add_block(std::to_string(i), std::make_shared<ResidualBlock>(kDim, gen));
    head = register_module("head", std::make_shared<Linear>(kDim, kVocab, 0.2, gen));
  }
  Tensor loss(const Tensor& ids, const Tensor& targets) const {
    return cross_entropy(head->forward(stack->forward(embed->forward(ids))), targets);
  }
  std::shared_ptr<Embedding> embed;
  std::shared_ptr<BlockStack> stack;
  std::shared_ptr<Linear> head;
};

Tensor ids(std::uint64_t seed) {
  Generator g(seed);
  std::vector<std::int64_t> v;
  for (float x : rand({kBatch, kSeq}, DType::f32, &g).to_vector<float>()) v.push_back(std::int64_t(x * kVocab));
  return from_vector<std::int64_t>(v, {kBatch, kSeq});
}

struct Run {
  float loss = 0;
  std::vector<std::pair<std::string, std::vector<float>>> grads;
  CheckpointCounters counters;
  std::int64_t activation_peak = 0;
};

// One forward + backward of a fresh Net under `plan`, dropout from a fixed seed.
Run run(const std::string& plan, std::int64_t blocks = 4) {
  Net net(blocks);
  net.stack->set_plan(plan);
  REQUIRE(net.stack->plan().spec == plan);
  const Tensor x = ids(1), y = ids(2);
  reset_checkpoint_counters();
  reset_saved_bytes_peak();
  const std::int64_t base = saved_bytes_report().activation_live_bytes;
  manual_seed(11);
  Tensor loss = net.loss(x, y);
  loss.backward();
  Run r;
  r.loss = loss.to_vector<float>().at(0);
  r.counters = checkpoint_counters();
  r.activation_peak = saved_bytes_report().activation_peak_bytes - base;
  for (const auto& [name, p] : net.named_parameters()) {
    REQUIRE(p.grad().defined());
    r.grads.emplace_back(name, p.grad().to_vector<float>());
  }
  return r;
}

// What `f` throws (Error's message), or "no error".
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// The valid forms a stack of ResidualBlocks lists.
bool lists_forms(const std::string& msg) {
  return msg.find("valid plans: none, per_block, chunk") != std::string::npos &&
         msg.find("selective:NAMES (norm, mlp, save_matmul, save_attention") != std::string::npos;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("a user's block stack names its parameters and lists its blocks' sub-regions", "[checkpoint][block_stack]") {
  Net net(3);
  CHECK(net.stack->num_blocks() == 3);
  CHECK(net.stack->block_name(2) == "2");
  CHECK(net.stack->sub_regions() == std::vector<std::string>{"norm", "mlp"});
  CHECK(net.stack->plan().is_none());
  std::vector<std::string> names;
  for (const auto& [n, p] : net.named_parameters()) names.push_back(n);
  REQUIRE(names.size() == 2 + 3 * 4);
  CHECK(names[0] == "embed.weight");
  CHECK(names[1] == "blocks.0.norm.weight");
  CHECK(names[2] == "blocks.0.mlp.gate_proj.weight");
  CHECK(names[4] == "blocks.0.mlp.down_proj.weight");
  CHECK(names[13] == "head.weight");
  CHECK_THROWS_WITH(net.stack->block(3), Catch::Contains("block 3 does not exist (the stack has 3 blocks)"));
}

TEST_CASE("every plan on a user's block stack gives the gradients of none bit for bit", "[checkpoint][block_stack]") {
  const Run none = run("none");
  CHECK(none.counters.regions == 0);
  REQUIRE(none.grads.size() == 2 + 4 * 4);
  const std::vector<std::string> block_plans = {
      "per_block", "chunk", "selected:0,2", "uniform:2", "block:2", "selective:save_matmul",
      "selective:save_attention", "selective:save_ops=matmul", "per_block+keep_last", "uniform:2+keep_last",
      "chunk+keep_last", "selected:1,3+block:1", "selective:save_matmul+keep_last", "per_block:reentrant",
      "uniform:2:reentrant", "chunk:reentrant+keep_last"};
  const std::vector<std::string> module_plans = {"selective:norm", "selective:mlp", "selective:norm,mlp",
                                                 "selective:mlp,norm"};
  std::vector<std::string> plans = block_plans;
  plans.insert(plans.end(), module_plans.begin(), module_plans.end());
  for (const auto& plan : plans) {
    INFO("plan " << plan);
    const Run r = run(plan);
    CHECK(std::memcmp(&r.loss, &none.loss, sizeof(float)) == 0);
    REQUIRE(r.grads.size() == none.grads.size());
    for (std::size_t i = 0; i < r.grads.size(); ++i) {
      INFO("parameter " << r.grads[i].first);
      CHECK(r.grads[i].first == none.grads[i].first);
      CHECK(same_bits(r.grads[i].second, none.grads[i].second));
    }
    // Every plan really runs regions and replays them.
    CHECK(r.counters.regions > 0);
    CHECK(r.counters.replays > 0);
  }
  // Mixes of block ranges too. (Offload plans are checked on the decoder, in
  // plans_dump_test.sh: this model's saves are below offload's 64 KiB floor.)
  const std::vector<std::pair<std::string, std::int64_t>> mixes = {
      {"per_block@0-1+selective:mlp@2-3", 4},       // two block regions, two mlp sub-regions
      {"selective:save_matmul@0-1+chunk@2-3", 3},   // two block regions with the policy, one chunk
      {"per_block:reentrant@0-1+selective:mlp@2-3", 4}};  // two reentrant block regions, two mlp sub-regions
  for (const auto& [plan, regions] : mixes) {
    INFO("plan " << plan);
    const Run r = run(plan);
    CHECK(std::memcmp(&r.loss, &none.loss, sizeof(float)) == 0);
    REQUIRE(r.grads.size() == none.grads.size());
    for (std::size_t i = 0; i < r.grads.size(); ++i) CHECK(same_bits(r.grads[i].second, none.grads[i].second));
    CHECK(r.counters.regions == regions);
    CHECK(r.counters.replays > 0);
  }
}

TEST_CASE("block-level plans on a user's stack region each block and save less", "[checkpoint][block_stack][memory]") {
  const Run none = run("none", 6);
  const Run per_block = run("per_block", 6);
  const Run chunk = run("chunk", 6);
  const Run mlp = run("selective:mlp", 6);
  CHECK(per_block.counters.regions == 6);
  CHECK(per_block.counters.replays == 6);
  CHECK(chunk.counters.regions == 1);
  CHECK(mlp.counters.regions == 6);
  CHECK(run("uniform:2", 6).counters.regions == 3);
  CHECK(run("per_block+keep_last", 6).counters.regions == 5);
  CHECK(none.activation_peak > 0);
  CHECK(per_block.activation_peak < none.activation_peak / 2);
  CHECK(chunk.activation_peak < none.activation_peak);
  CHECK(mlp.activation_peak < none.activation_peak);
  WARN("activation peak bytes: none " << none.activation_peak << " per_block " << per_block.activation_peak
                                      << " chunk " << chunk.activation_peak << " selective:mlp "
                                      << mlp.activation_peak);
}

TEST_CASE("bad plans on a user's stack are rejected naming the component and the blocks' names",
          "[checkpoint][block_stack]") {
  Net net(4);
  BlockStack& s = *net.stack;
  std::string e = error_of([&] { s.set_plan("selective:foo"); });
  CHECK_THAT(e, Catch::Contains("--recompute selective:foo: unknown selective name 'foo' in 'selective:foo' "
                                "(neither a sub-region the blocks offer nor an op policy)"));
  CHECK(lists_forms(e));
  CHECK_THROWS_WITH(s.set_plan("uniform:2+selective:mlp,bar"), Catch::Contains("unknown selective name 'bar'"));
  // The decoder's names are not this stack's.
  e = error_of([&] { s.set_plan("attention"); });
  CHECK_THAT(e, Catch::Contains("unknown component 'attention'"));
  CHECK(lists_forms(e));
  CHECK_THROWS_WITH(s.set_plan("selective:core_attn"), Catch::Contains("unknown selective name 'core_attn'"));
  // A plan parsed with the decoder's names (as the CLI does) is checked against the blocks.
  e = error_of([&] { s.set_plan(RecomputePlan::parse("selective:core_attn", 4)); });
  CHECK_THAT(e, Catch::Contains("unknown selective name 'core_attn' in 'selective:core_attn'"));
  CHECK(lists_forms(e));
  CHECK_THROWS_WITH(s.set_plan(RecomputePlan::parse("per_block", 5)),
                    Catch::Contains("block 4 does not exist (the plan was parsed for more blocks than this stack's 4)"));
  CHECK_THROWS_WITH(s.set_plan("mlp"), Catch::Contains("unknown component 'mlp' (a sub-region: write selective:mlp)"));
  CHECK_THROWS_WITH(s.set_plan("selected:4"), Catch::Contains("block 4 does not exist (the model has 4 blocks)"));
  CHECK_THROWS_WITH(s.set_plan("uniform:2+selective:mlp"),
                    Catch::Contains("module regions would nest inside the block's region"));
  CHECK_THROWS_WITH(s.set_plan("selective:mlp,mlp"), Catch::Contains("overlap (both cover mlp)"));
  CHECK(s.plan().is_none());  // a rejected plan leaves the old one
  s.set_plan("per_block");
  Generator gen(0);
  CHECK_THROWS_WITH(s.add_block("4", std::make_shared<ResidualBlock>(kDim, gen)),
                    Catch::Contains("added after plan 'per_block' was set"));
  s.set_plan("none");
  CHECK_THROWS_WITH(s.add_block("3", std::make_shared<ResidualBlock>(kDim, gen)),
                    Catch::Contains("a block named '3' is already in the stack"));
  CHECK_THROWS_WITH(s.add_block("a.b", std::make_shared<ResidualBlock>(kDim, gen)),
                    Catch::Contains("must be non-empty and without '.'"));
  CHECK_THROWS_WITH(s.add_block("x", std::shared_ptr<ResidualBlock>()), Catch::Contains("block 'x' is null"));
}

TEST_CASE("the decoder's layers are a block stack that apply_recompute_plan sets", "[checkpoint][block_stack]") {
  ModelConfig c = ModelConfig::named("tiny");
  c.n_layers = 2;
  DecoderModel m(c, 0);
  REQUIRE(m.model->blocks->num_blocks() == 2);
  CHECK(&m.model->blocks->block(1) == m.model->layers[1].get());
  CHECK(m.named_parameters()[1].first == "model.layers.0.input_layernorm.weight");
  CHECK(m.model->blocks->sub_regions() == std::vector<std::string>{"attention", "core_attn", "layernorm", "mlp"});
  apply_recompute_plan(m, RecomputePlan::parse("per_block+keep_last", 2));
  CHECK(m.model->blocks->plan().block_regions == std::vector<std::vector<std::int64_t>>{{0}});
  apply_recompute_plan(m, RecomputePlan::parse("selective:mlp", 2));
  CHECK(m.model->layers[0]->regions() == std::set<std::string>{"mlp"});
  m.model->blocks->set_plan("attention");  // the same plans through the stack itself
  CHECK(m.model->layers[1]->regions() == std::set<std::string>{"attention"});
  CHECK_THROWS_WITH(m.model->blocks->set_plan("moe_expert"), Catch::Contains("unknown component 'moe_expert'"));
}

TEST_CASE("chunked_loss is refused on a stack whose model declared no LM head", "[checkpoint][block_stack][chunked_loss]") {
  Net net(4);  // its head runs cross_entropy itself: no LM head that takes the plan
  BlockStack& s = *net.stack;
  s.set_plan("per_block");
  for (const std::string spec : {"chunked_loss", "chunked_loss:256", "per_block+chunked_loss"}) {
    INFO(spec);
    const std::string e = error_of([&] { s.set_plan(spec); });
    CHECK_THAT(e, Catch::Contains("--recompute " + spec + ": chunked_loss needs a model whose blocks are followed by "
                                  "an LM head") &&
                      Catch::Contains("this stack's model has none (BlockStack::set_has_lm_head)"));
    CHECK_THROWS_WITH(s.set_plan(RecomputePlan::parse(spec, 4)), Catch::Contains("chunked_loss needs a model"));
    CHECK(s.plan().str() == "per_block");  // a rejected plan leaves the old one
  }
  // A model that declares its head (as the decoder does) may ask for it.
  s.set_has_lm_head(true);
  s.set_plan("per_block+chunked_loss:256");
  CHECK(s.plan().chunked_loss);
  CHECK(s.plan().loss_chunk == 256);
  ModelConfig c = ModelConfig::named("tiny");
  c.n_layers = 2;
  DecoderModel m(c, 0);
  m.model->blocks->set_plan("chunked_loss");
  CHECK(m.model->blocks->plan().chunked_loss);
  apply_recompute_plan(m, RecomputePlan::parse("per_block+chunked_loss:512", 2));
  CHECK(m.model->blocks->plan().str() == "per_block+chunked_loss:512");
}

namespace {

// Side outputs on a user's stack: each block also hands out a penalty
// (mean of its MLP's output squared) that the model adds to the loss, to the
// list open on this thread.
thread_local std::vector<Tensor>* tls_penalties = nullptr;

class PenaltyBlock : public ResidualBlock {
 public:
  using ResidualBlock::ResidualBlock;
  Tensor forward(const Tensor& x) const override {
    const Tensor m = mlp->forward(norm->forward(x));
    const Tensor penalty = mean(mul(m, m));  // computed on every run (a replay must run the same ops)
    if (tls_penalties) tls_penalties->push_back(penalty);
    return add(x, dropout(m, 0.2, training()));
  }
  std::string side_outputs() const override { return "a penalty on its MLP's output"; }
};

// Opens `list` as this thread's penalty list for the scope.
class PenaltyScope {
 public:
  explicit PenaltyScope(std::vector<Tensor>* list) : previous_(std::exchange(tls_penalties, list)) {}
  ~PenaltyScope() { tls_penalties = previous_; }
  PenaltyScope(const PenaltyScope&) = delete;
  PenaltyScope& operator=(const PenaltyScope&) = delete;

 private:
  std::vector<Tensor>* previous_;
};

class PenaltyChannel final : public SideOutputChannel {
 public:
  std::vector<Tensor> capture(const std::function<void()>& run, std::any*) override {
    std::vector<Tensor> local;
    PenaltyScope open(&local);
    run();
    return local;
  }
  void emit(std::vector<Tensor> outputs, std::any) override {
    if (tls_penalties) tls_penalties->insert(tls_penalties->end(), outputs.begin(), outputs.end());
  }
};

// Loss and gradients of one step of 4 PenaltyBlocks under `plan` (the stack
// given the channel when `channel`).
Run penalty_run(const std::string& plan, bool channel) {
  Generator gen(5);
  Embedding embed(kVocab, kDim, 0.5, gen);
  BlockStack stack;
  for (int i = 0; i < 4; ++i) stack.add_block(std::to_string(i), std::make_shared<PenaltyBlock>(kDim, gen));
  Linear head(kDim, kVocab, 0.2, gen);
  if (channel) stack.set_side_outputs(std::make_shared<PenaltyChannel>());
  stack.set_plan(plan);
  manual_seed(11);
  std::vector<Tensor> penalties;
  Tensor loss;
  {
    PenaltyScope open(&penalties);
    loss = cross_entropy(head.forward(stack.forward(embed.forward(ids(1)))), ids(2));
  }
  REQUIRE(penalties.size() == 4);
  for (const Tensor& p : penalties) loss = add(loss, mul(p, 0.1));
  loss.backward();
  Run r;
  r.loss = loss.to_vector<float>().at(0);
  for (const auto& [name, p] : stack.named_parameters()) r.grads.emplace_back(name, p.grad().to_vector<float>());
  for (const auto& [name, p] : embed.named_parameters()) r.grads.emplace_back(name, p.grad().to_vector<float>());
  return r;
}

}  // namespace

TEST_CASE("side outputs leave a reentrant region as its outputs through the stack's channel", "[checkpoint][block_stack]") {
  // Without a channel the plan is refused naming the block and what it hands out.
  CHECK_THAT(error_of([] { penalty_run("per_block:reentrant", false); }),
             Catch::Contains("block 0 ('0') is in a reentrant region, but its forward hands out a penalty on its "
                             "MLP's output") &&
                 Catch::Contains("BlockStack::set_side_outputs"));
  const Run none = penalty_run("none", false);
  for (const std::string plan : {"per_block:reentrant", "chunk:reentrant", "uniform:2:reentrant", "per_block"}) {
    INFO(plan);
    const Run got = penalty_run(plan, true);
    CHECK(got.loss == none.loss);
    REQUIRE(got.grads.size() == none.grads.size());
    for (std::size_t i = 0; i < got.grads.size(); ++i) {
      INFO(got.grads[i].first);
      CHECK(same_bits(got.grads[i].second, none.grads[i].second));
    }
  }
}
