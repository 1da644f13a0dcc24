#include <catch2/catch.hpp>

#include <map>

#include "checkpoint/checkpoint.h"
#include "checkpoint/plan.h"
#include "engine/autograd.h"
#include "models/decoder.h"
#include "models/recompute.h"

using namespace remat;

namespace {
using Groups = std::vector<std::vector<std::int64_t>>;
}

TEST_CASE("plans parse into the regions docs/RECOMPUTE.md lists", "[checkpoint][plan]") {
  CHECK(RecomputePlan::parse("none", 4).is_none());
  CHECK(RecomputePlan::parse("per_block", 3).block_regions == Groups{{0}, {1}, {2}});
  CHECK(RecomputePlan::parse("chunk", 3).block_regions == Groups{{0, 1, 2}});
  CHECK(RecomputePlan::parse("selected:0,2", 4).block_regions == Groups{{0}, {2}});
  CHECK(RecomputePlan::parse("uniform:2", 5).block_regions == Groups{{0, 1}, {2, 3}, {4}});
  CHECK(RecomputePlan::parse("block:2", 4).block_regions == Groups{{0}, {1}});
  CHECK(RecomputePlan::parse("attention", 4).modules == std::set<std::string>{"attention"});
  CHECK(RecomputePlan::parse("selective:mlp,layernorm", 4).modules == std::set<std::string>{"layernorm", "mlp"});
  auto sel = RecomputePlan::parse("selective:save_matmul", 2);
  CHECK(sel.policy != nullptr);
  CHECK(sel.block_regions == Groups{{0}, {1}});
  CHECK(RecomputePlan::parse("selected:2,3+block:2", 4).block_regions == Groups{{2}, {3}, {0}, {1}});
  CHECK(RecomputePlan::parse("attention+selective:mlp", 4).modules.size() == 2);
  // keep_last: the last block leaves its region (a group shrinks, a single-block region goes).
  CHECK(RecomputePlan::parse("per_block+keep_last", 3).block_regions == Groups{{0}, {1}});
  CHECK(RecomputePlan::parse("keep_last+per_block", 3).block_regions == Groups{{0}, {1}});
  CHECK(RecomputePlan::parse("chunk+keep_last", 3).block_regions == Groups{{0, 1}});
  CHECK(RecomputePlan::parse("uniform:2+keep_last", 5).block_regions == Groups{{0, 1}, {2, 3}});
  CHECK(RecomputePlan::parse("uniform:2+keep_last", 4).block_regions == Groups{{0, 1}, {2}});
  CHECK(RecomputePlan::parse("selected:0,2+keep_last", 4).block_regions == Groups{{0}});
  CHECK(RecomputePlan::parse("per_block+keep_last", 1).is_none());
  auto sel_last = RecomputePlan::parse("selective:save_matmul+keep_last", 3);
  CHECK(sel_last.policy != nullptr);
  CHECK(sel_last.block_regions == Groups{{0}, {1}});
}

TEST_CASE("overlapping or unknown plans are rejected with the reason", "[checkpoint][plan]") {
  CHECK_THROWS_WITH(RecomputePlan::parse("chunk+per_block", 4),
                    Catch::Contains("'chunk' and 'per_block' overlap at block 0"));
  CHECK_THROWS_WITH(RecomputePlan::parse("selected:1+block:2", 4),
                    Catch::Contains("'selected:1' and 'block:2' overlap at block 1"));
  CHECK_THROWS_WITH(RecomputePlan::parse("per_block+attention", 4),
                    Catch::Contains("module regions would nest inside the block's region"));
  CHECK_THROWS_WITH(RecomputePlan::parse("attention+selective:core_attn", 4),
                    Catch::Contains("overlap (both cover core_attn)"));
  CHECK_THROWS_WITH(RecomputePlan::parse("attention+selective:layernorm", 4),
                    Catch::Contains("overlap (both cover input_layernorm)"));
  CHECK_THROWS_WITH(RecomputePlan::parse("per_blok", 4), Catch::Contains("unknown component 'per_blok'") &&
                                                             Catch::Contains("valid plans: none, per_block"));
  CHECK_THROWS_WITH(RecomputePlan::parse("selected:7", 4), Catch::Contains("block 7 does not exist"));
  CHECK_THROWS_WITH(RecomputePlan::parse("uniform:0", 4), Catch::Contains("uniform:N needs 1 <= N <= 4"));
  CHECK_THROWS_WITH(RecomputePlan::parse("uniform:x", 4), Catch::Contains("expects a non-negative integer"));
  CHECK_THROWS_WITH(RecomputePlan::parse("selective:foo", 4), Catch::Contains("unknown selective name 'foo'"));
  CHECK_THROWS_WITH(RecomputePlan::parse("none+chunk", 4), Catch::Contains("'none' cannot be combined"));
  CHECK_THROWS_WITH(RecomputePlan::parse("keep_last", 4), Catch::Contains("'keep_last' needs block-level regions"));
  CHECK_THROWS_WITH(RecomputePlan::parse("attention+keep_last", 4),
                    Catch::Contains("'keep_last' needs block-level regions"));
  CHECK_THROWS_WITH(RecomputePlan::parse("per_block+keep_last+keep_last", 4), Catch::Contains("'keep_last' given twice"));
  DecoderModel dense(ModelConfig::named("tiny"), 0);
  CHECK_THROWS_WITH(apply_recompute_plan(dense, RecomputePlan::parse("moe_expert", 4)),
                    Catch::Contains("'moe_expert' needs MoE blocks"));
}

TEST_CASE("plans parse against the sub-region names a model's blocks offer", "[checkpoint][plan]") {
  // The default is the decoder's list; its error messages list it as before.
  CHECK(RecomputePlan::builtin_sub_regions() ==
        std::vector<std::string>{"attention", "moe_expert", "core_attn", "layernorm", "mlp", "moe_act", "moe",
                                 "shared_experts"});
  CHECK_THROWS_WITH(RecomputePlan::parse("selective:foo", 4),
                    Catch::Contains("valid plans: none, per_block, chunk, selected:I,J,..., uniform:N, block:N, "
                                    "attention, moe_expert, keep_last (with block regions), offload, offload:NAMES, "
                                    "compress:bf16|fp8, compress:bf16|fp8:NAMES|all, chunked_loss, "
                                    "chunked_loss:N (tokens per chunk), keep_gathered (with --zero 3), dynamic, dynamic:BYTES (with "
                                    "--memory-budget, or the budget in bytes), selective:NAMES "
                                    "(core_attn, layernorm, mlp, moe_act, moe, shared_experts, save_matmul, "
                                    "save_attention, save_ops=OP/OP/... with OP one of "));
  CHECK_THROWS_WITH(RecomputePlan::parse("selective:attention", 4),
                    Catch::Contains("'attention' is a component of its own, without selective:"));
  CHECK_THROWS_WITH(RecomputePlan::parse("core_attn", 4),
                    Catch::Contains("unknown component 'core_attn' (a sub-region: write selective:core_attn)"));

  // A user's names: each under selective:, covering only itself.
  const std::vector<std::string> mine = {"norm", "ffn", "act_2"};
  CHECK(RecomputePlan::parse("selective:ffn,norm", 3, mine).modules == std::set<std::string>{"ffn", "norm"});
  CHECK(RecomputePlan::parse("selective:act_2+selective:ffn", 3, mine).modules.size() == 2);
  CHECK(RecomputePlan::parse("uniform:2+keep_last", 3, mine).block_regions == Groups{{0, 1}});
  CHECK(RecomputePlan::parse("selective:save_matmul", 3, mine).policy != nullptr);
  CHECK_THROWS_WITH(RecomputePlan::parse("selective:core_attn", 3, mine),
                    Catch::Contains("unknown selective name 'core_attn' in 'selective:core_attn'") &&
                        Catch::Contains("selective:NAMES (norm, ffn, act_2, save_matmul"));
  CHECK_THROWS_WITH(RecomputePlan::parse("attention", 3, mine), Catch::Contains("unknown component 'attention'") &&
                                                                   Catch::Contains("block:N, keep_last"));
  CHECK_THROWS_WITH(RecomputePlan::parse("selective:ffn,ffn", 3, mine), Catch::Contains("overlap (both cover ffn)"));
  CHECK_THROWS_WITH(RecomputePlan::parse("per_block+selective:ffn", 3, mine),
                    Catch::Contains("module regions would nest inside the block's region"));
  CHECK_THROWS_WITH(RecomputePlan::parse("selective:foo", 3, {}), Catch::Contains("selective:NAMES (save_matmul"));
  for (const std::string bad : {"", "a+b", "x,y", "a:b", "save_x", "a b", "all", "reentrant"})
    CHECK_THROWS_WITH(RecomputePlan::parse("none", 3, {bad}),
                      Catch::Contains("sub-region name '" + bad + "' is not usable in a plan"));
}

namespace {

// A model of L blocks small enough to run quickly; shapes chosen so a block's
// saved tensors are several times its input.
ModelConfig memory_config(std::int64_t layers) {
  ModelConfig c = ModelConfig::named("tiny");
  c.name = "memory-test";
  c.n_layers = layers;
  c.d_model = 64;
  c.n_heads = 4;
  c.ffn = 172;
  c.seq = 64;
  c.batch = 4;
  return c;
}

Tensor batch_for(const ModelConfig& c) {
  Generator g(3);
  Tensor u = rand({c.batch, c.seq + 1}, DType::f32, &g);
  std::vector<std::int64_t> ids;
  for (float x : u.to_vector<float>()) ids.push_back(std::int64_t(x * 255.0f));
  return from_vector<std::int64_t>(ids, {c.batch, c.seq + 1});
}

// Peak bytes held for backward over one forward + backward under `plan`.
std::int64_t peak_saved(const ModelConfig& c, const std::string& plan) {
  DecoderModel m(c, 1);
  apply_recompute_plan(m, RecomputePlan::parse(plan, c.n_layers));
  Tensor tokens = batch_for(c);
  const std::int64_t base = saved_bytes_live();
  reset_saved_bytes_peak();
  auto out = m.forward_loss(tokens);
  out.loss.backward();
  if (saved_bytes_live() != base)
    for (auto& [op, b] : saved_bytes_report().bytes_by_op) WARN(plan << " still held by " << op << ": " << b);
  REQUIRE(saved_bytes_live() == base);
  return saved_bytes_report().peak_bytes - base;
}

}  // namespace

TEST_CASE("peak saved bytes follow the arithmetic of each plan", "[checkpoint][plan][memory]") {
  const std::int64_t L = 8;
  const ModelConfig c = memory_config(L);
  const double I = double(c.batch * c.seq * c.d_model * 4);  // one block input, bytes

  // One block's saved bytes (S_b) and the rest of the model's (embedding,
  // final norm, head, loss: H), measured from the plain run of 1 and 2 blocks.
  const double one = double(peak_saved(memory_config(1), "none"));
  const double two = double(peak_saved(memory_config(2), "none"));
  const double Sb = two - one;
  const double H = one - Sb;
  REQUIRE(Sb > 4 * I);

  const double none = double(peak_saved(c, "none"));
  CHECK(none == Approx(L * Sb + H).epsilon(0.02));

  // per_block: every block input is kept, plus one block's saves at a time.
  const double per_block = double(peak_saved(c, "per_block"));
  CHECK(per_block == Approx(L * I + std::max(Sb, H)).epsilon(0.10));
  CHECK(per_block < 0.5 * none);
  // per_block+keep_last: the last block's saves stay, next to the head's.
  const double keep_last = double(peak_saved(c, "per_block+keep_last"));
  CHECK(keep_last == Approx(double(L - 1) * I + Sb + H).epsilon(0.10));

  // uniform:g: L/g kept inputs plus g blocks' saves while a group replays.
  for (std::int64_t g : {2, 4}) {
    INFO("uniform:" << g);
    const double u = double(peak_saved(c, "uniform:" + std::to_string(g)));
    CHECK(u == Approx(double(L / g) * I + std::max(double(g) * Sb, H)).epsilon(0.10));
  }
  // chunk: one input kept, the whole stack replays at once.
  const double chunk = double(peak_saved(c, "chunk"));
  CHECK(chunk == Approx(I + std::max(L * Sb, H)).epsilon(0.10));

  // Selective (save matmul outputs) sits between none and per_block.
  const double sel = double(peak_saved(c, "selective:save_matmul"));
  CHECK(sel > per_block);
  CHECK(sel < none);
  WARN("I " << I << " Sb " << Sb << " H " << H << " none " << none << " per_block " << per_block
            << " chunk " << chunk << " selective " << sel);
}

TEST_CASE("offload and compress components parse, combine and refuse nonsense", "[checkpoint][plan]") {
  auto off = RecomputePlan::parse("offload", 4);
  CHECK(off.offload);
  CHECK(off.offload_modules.empty());
  CHECK(!off.is_none());
  CHECK(off.block_regions.empty());
  auto pb = RecomputePlan::parse("per_block+offload", 4);
  CHECK(pb.offload);
  CHECK(pb.block_regions.size() == 4);
  auto mod = RecomputePlan::parse("offload:mlp,core_attn+selective:layernorm", 4);
  CHECK(mod.offload_modules == std::set<std::string>{"core_attn", "mlp"});
  CHECK(mod.modules == std::set<std::string>{"layernorm"});
  auto c = RecomputePlan::parse("per_block+compress:fp8", 4);
  CHECK(c.compress);
  CHECK(c.compress_format == CompressFormat::fp8);
  auto cb = RecomputePlan::parse("compress:bf16:mlp+offload", 4);
  CHECK(cb.compress_format == CompressFormat::bf16);
  CHECK(cb.compress_modules == std::set<std::string>{"mlp"});
  CHECK(cb.offload);
  CHECK(RecomputePlan::parse("block:2+offload:mlp", 4).offload_modules.size() == 1);

  using Catch::Contains;
  CHECK_THROWS_WITH(RecomputePlan::parse("offload+offload:mlp", 4), Contains("offload given twice"));
  CHECK_THROWS_WITH(RecomputePlan::parse("compress:fp8+compress:bf16", 4), Contains("compress given twice"));
  CHECK_THROWS_WITH(RecomputePlan::parse("compress:int4", 4), Contains("'compress:int4': unknown format 'int4'"));
  CHECK_THROWS_WITH(RecomputePlan::parse("offload:attn", 4),
                    Contains("'offload:attn' names 'attn', which is not a sub-region the blocks offer"));
  CHECK_THROWS_WITH(RecomputePlan::parse("selective:mlp+offload:mlp", 4),
                    Contains("mlp's saves are recomputed there, not kept, so there is nothing to offload"));
  CHECK_THROWS_WITH(RecomputePlan::parse("attention+compress:fp8:core_attn", 4),
                    Contains("nothing to compress"));
  CHECK_THROWS_WITH(RecomputePlan::parse("per_block+offload:mlp", 4),
                    Contains("every block is in a block-level region") && Contains("use 'offload' (without names)"));
  CHECK_THROWS_WITH(RecomputePlan::parse("compress:fp8:moe_act", 4, {"moe_act", "mlp"}),
                    Contains("keeps no saves of its own"));
}

TEST_CASE("block ranges limit components; plans print back to an equal plan", "[checkpoint][plan]") {
  auto p = RecomputePlan::parse("per_block@0-3+selective:save_matmul@4-7+offload@0-1", 8);
  CHECK(p.block_regions == Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}});
  CHECK(p.region_policies[0] == nullptr);
  CHECK(p.region_policies[4] != nullptr);
  CHECK(p.region_policy_names[7] == "save_matmul");
  CHECK(p.offload_range == std::make_pair(std::int64_t(0), std::int64_t(1)));
  CHECK(RecomputePlan::in_range(p.offload_range, 1));
  CHECK(!RecomputePlan::in_range(p.offload_range, 2));
  auto m = RecomputePlan::parse("selective:mlp@2-3+attention@0", 4);
  CHECK(m.block_modules[0] == std::set<std::string>{"attention"});
  CHECK(m.block_modules[1].empty());
  CHECK(m.block_modules[2] == std::set<std::string>{"mlp"});
  CHECK(RecomputePlan::parse("uniform:2@2-5", 6).block_regions == Groups{{2, 3}, {4, 5}});
  CHECK(RecomputePlan::parse("chunk@1-2+per_block@3", 4).block_regions == Groups{{1, 2}, {3}});
  // Module regions and block regions may share a stack, not a block.
  CHECK(RecomputePlan::parse("per_block@0-1+selective:mlp@2-3", 4).block_modules[3].count("mlp") == 1);

  using Catch::Contains;
  CHECK_THROWS_WITH(RecomputePlan::parse("per_block@2-9", 4), Contains("block range @2-9 needs A <= B < 4"));
  CHECK_THROWS_WITH(RecomputePlan::parse("per_block@3-1", 4), Contains("needs A <= B < 4"));
  CHECK_THROWS_WITH(RecomputePlan::parse("per_block@0-2+chunk@2-3", 4), Contains("overlap at block 2"));
  CHECK_THROWS_WITH(RecomputePlan::parse("selected:1@0-2", 4), Contains("names its blocks itself and takes no @range"));
  CHECK_THROWS_WITH(RecomputePlan::parse("keep_last@3+per_block", 4), Contains("'keep_last' takes no @range"));
  CHECK_THROWS_WITH(RecomputePlan::parse("per_block@0-1+selective:mlp@1-2", 4),
                    Contains("overlap at block 1 (module regions would nest"));
  CHECK_THROWS_WITH(RecomputePlan::parse("selective:mlp@0-2+selective:mlp@2-3", 4), Contains("in block 2"));
  CHECK_THROWS_WITH(RecomputePlan::parse("per_block@0-1+offload:mlp@0-1", 4),
                    Contains("every block of its range is in a block-level region"));

  // Round trip: parse(str(p)) == p, for every plan form.
  const std::vector<std::string> specs = {
      "none", "per_block", "chunk", "selected:0,2", "uniform:2", "block:3", "attention", "selective:core_attn",
      "selective:mlp,layernorm", "selective:save_matmul", "selective:save_ops=matmul/scaled_dot_product_attention",
      "selected:1,3+block:1", "attention+selective:mlp", "per_block+keep_last", "uniform:2+keep_last", "offload",
      "per_block+offload", "offload:mlp,core_attn", "compress:fp8", "compress:bf16:mlp+offload", "compress:fp8:all",
      "per_block@0-3+selective:save_matmul@4-7+offload@0-1", "selective:mlp@2-3+attention@0", "uniform:3@1-7",
      "chunk@1-2+per_block@3+compress:bf16@0-5", "per_block@0-1+selective:mlp@2-5+offload:mlp@6-7"};
  for (const auto& spec : specs) {
    INFO(spec);
    const auto plan = RecomputePlan::parse(spec, 8);
    const std::string printed = plan.str();
    INFO("printed: " << printed);
    CHECK(RecomputePlan::parse(printed, 8) == plan);
    CHECK(RecomputePlan::parse(printed, 8).str() == printed);  // canonical
  }
  CHECK(RecomputePlan::parse("per_block", 8).str() == "per_block");
  CHECK(RecomputePlan::parse("per_block+keep_last", 8).str() == "per_block@0-6");
  CHECK(RecomputePlan::parse("uniform:4", 8).str() == "chunk@0-3+chunk@4-7");
  CHECK(RecomputePlan::parse("none", 8).str() == "none");
}

TEST_CASE("chunked_loss parses, prints last, compares and refuses bad sizes", "[checkpoint][plan][chunked_loss]") {
  const auto plain = RecomputePlan::parse("chunked_loss", 4);
  CHECK(plain.chunked_loss);
  CHECK(plain.loss_chunk == 0);  // the model's default
  CHECK(!plain.is_none());
  CHECK(plain.block_regions.empty());
  CHECK(plain.modules.empty());
  CHECK(plain.str() == "chunked_loss");
  const auto n = RecomputePlan::parse("chunked_loss:512", 4);
  CHECK(n.chunked_loss);
  CHECK(n.loss_chunk == 512);
  CHECK(!n.is_none());
  CHECK(n.str() == "chunked_loss:512");
  CHECK(RecomputePlan::parse("chunked_loss:1", 4).loss_chunk == 1);
  // With other components: the blocks' plan as without it, chunked_loss printed last.
  const auto pb = RecomputePlan::parse("chunked_loss:256+per_block", 4);
  CHECK(pb.block_regions == Groups{{0}, {1}, {2}, {3}});
  CHECK(pb.loss_chunk == 256);
  CHECK(pb.str() == "per_block+chunked_loss:256");
  CHECK(RecomputePlan::parse("per_block+chunked_loss:256", 4).str() == "per_block+chunked_loss:256");
  CHECK(RecomputePlan::parse("chunked_loss+offload+selective:save_matmul", 4).str() ==
        "selective:save_matmul+offload+chunked_loss");
  CHECK(RecomputePlan::parse("chunked_loss+compress:fp8+per_block@0-1", 4).str() ==
        "per_block@0-1+compress:fp8+chunked_loss");
  // Equality: the component and its size count, the order written does not.
  CHECK(RecomputePlan::parse("chunked_loss:256+per_block", 4) == pb);
  CHECK(!(RecomputePlan::parse("per_block+chunked_loss:512", 4) == pb));
  CHECK(!(RecomputePlan::parse("per_block+chunked_loss", 4) == pb));
  CHECK(!(RecomputePlan::parse("per_block", 4) == pb));
  CHECK(!(RecomputePlan::parse("none", 4) == plain));
  CHECK(RecomputePlan::parse("chunked_loss", 4) == plain);
  for (const std::string spec : {"chunked_loss", "chunked_loss:512", "per_block+chunked_loss:256",
                                 "per_block@0-3+selective:save_matmul@4-7+offload@0-1+chunked_loss:100",
                                 "uniform:2+keep_last+compress:bf16+chunked_loss"}) {
    INFO(spec);
    const auto plan = RecomputePlan::parse(spec, 8);
    CHECK(RecomputePlan::parse(plan.str(), 8) == plan);
    CHECK(RecomputePlan::parse(plan.str(), 8).str() == plan.str());
  }

  using Catch::Contains;
  CHECK_THROWS_WITH(RecomputePlan::parse("chunked_loss@0-1", 4),
                    Contains("'chunked_loss@0-1': chunked_loss takes no @range (the loss comes after the blocks)"));
  CHECK_THROWS_WITH(RecomputePlan::parse("per_block+chunked_loss@2", 4), Contains("chunked_loss takes no @range"));
  CHECK_THROWS_WITH(RecomputePlan::parse("chunked_loss+chunked_loss:256", 4),
                    Contains("'chunked_loss:256': chunked_loss given twice"));
  CHECK_THROWS_WITH(RecomputePlan::parse("chunked_loss:0", 4),
                    Contains("'chunked_loss:0': a chunk must be at least 1 token, got 0"));
  CHECK_THROWS_WITH(RecomputePlan::parse("chunked_loss:-5", 4),
                    Contains("'chunked_loss:-5': N expects a non-negative integer, got '-5'"));
  CHECK_THROWS_WITH(RecomputePlan::parse("chunked_loss:abc", 4),
                    Contains("'chunked_loss:abc': N expects a non-negative integer, got 'abc'"));
  CHECK_THROWS_WITH(RecomputePlan::parse("chunked_loss:1.5", 4), Contains("expects a non-negative integer, got '1.5'"));
  CHECK_THROWS_WITH(RecomputePlan::parse("chunked_loss:", 4), Contains("expects a non-negative integer, got ''"));
  CHECK_THROWS_WITH(RecomputePlan::parse("chunked_loss:99999999999999999999", 4), Contains("is too large"));
  CHECK_THROWS_WITH(RecomputePlan::parse("none+chunked_loss", 4), Contains("'none' cannot be combined"));
  // The valid forms name it.
  CHECK_THROWS_WITH(RecomputePlan::parse("chunked_los", 4),
                    Contains("unknown component 'chunked_los'") && Contains("chunked_loss, chunked_loss:N"));
}

TEST_CASE("keep_gathered: a ranged component of its own that round-trips", "[plan]") {
  const RecomputePlan p = RecomputePlan::parse("per_block+keep_gathered@1-2", 4);
  CHECK(p.keep_gathered);
  CHECK_FALSE(p.keeps_gathered(0));
  CHECK(p.keeps_gathered(1));
  CHECK(p.keeps_gathered(2));
  CHECK_FALSE(p.keeps_gathered(3));
  CHECK(p.str() == "per_block+keep_gathered@1-2");
  CHECK(RecomputePlan::parse(p.str(), 4) == p);
  CHECK(RecomputePlan::parse("keep_gathered", 4).keeps_gathered(3));
  CHECK_FALSE(RecomputePlan::parse("keep_gathered", 4).is_none());
  CHECK_THROWS_WITH(RecomputePlan::parse("keep_gathered+keep_gathered@1", 4), Catch::Contains("given twice"));
  CHECK_THROWS_WITH(RecomputePlan::parse("keep_gathered@4", 4), Catch::Contains("needs A <= B < 4"));
}

TEST_CASE("dynamic[:BYTES] parses, combines with other components and prints back", "[checkpoint][plan]") {
  const RecomputePlan d = RecomputePlan::parse("dynamic", 4);
  CHECK(d.dynamic);
  CHECK(d.dynamic_budget == 0);
  CHECK_FALSE(d.is_none());
  CHECK(d.str() == "dynamic");
  const RecomputePlan b = RecomputePlan::parse("per_block+dynamic:123456", 4);
  CHECK(b.dynamic);
  CHECK(b.dynamic_budget == 123456);
  CHECK(b.block_regions.size() == 4);
  CHECK(b.str() == "per_block+dynamic:123456");
  CHECK(RecomputePlan::parse(b.str(), 4) == b);
  CHECK_FALSE(RecomputePlan::parse("dynamic:1", 4) == RecomputePlan::parse("dynamic:2", 4));
  CHECK_THROWS_WITH(RecomputePlan::parse("dynamic+dynamic", 4), Catch::Contains("dynamic given twice"));
  CHECK_THROWS_WITH(RecomputePlan::parse("dynamic@0-1", 4), Catch::Contains("dynamic takes no @range"));
  CHECK_THROWS_WITH(RecomputePlan::parse("dynamic:0", 4), Catch::Contains("at least 1 byte"));
  CHECK_THROWS_WITH(RecomputePlan::parse("dynamic:lots", 4), Catch::Contains("dynamic:lots"));
}

TEST_CASE("C:reentrant makes reentrant block regions that print back, compare and refuse the rest",
          "[checkpoint][plan]") {
  using Reentrant = std::vector<bool>;
  const auto pb = RecomputePlan::parse("per_block:reentrant", 4);
  CHECK(pb.block_regions == Groups{{0}, {1}, {2}, {3}});
  CHECK(pb.region_reentrant == Reentrant{true, true, true, true});
  for (const auto& policy : pb.region_policies) CHECK(policy == nullptr);
  CHECK(pb.str() == "per_block:reentrant");
  CHECK(RecomputePlan::parse("chunk:reentrant", 4).block_regions == Groups{{0, 1, 2, 3}});
  CHECK(RecomputePlan::parse("chunk:reentrant", 4).str() == "chunk:reentrant");
  const auto u = RecomputePlan::parse("uniform:2:reentrant@0-3", 6);
  CHECK(u.block_regions == Groups{{0, 1}, {2, 3}});
  CHECK(u.region_reentrant == Reentrant{true, true});
  CHECK(u.str() == "chunk:reentrant@0-1+chunk:reentrant@2-3");
  CHECK(RecomputePlan::parse("selected:0,2:reentrant", 4).str() == "per_block:reentrant@0+per_block:reentrant@2");
  CHECK(RecomputePlan::parse("block:2:reentrant", 4).str() == "per_block:reentrant@0-1");
  // Mixed with plain regions, policies and module regions in other blocks.
  const auto mixed = RecomputePlan::parse("per_block:reentrant@0-1+per_block@2-3", 4);
  CHECK(mixed.region_reentrant == Reentrant{true, true, false, false});
  CHECK(mixed.str() == "per_block:reentrant@0-1+per_block@2-3");
  CHECK(RecomputePlan::parse("per_block:reentrant@0-1+selective:save_matmul@2-3", 4).str() ==
        "per_block:reentrant@0-1+selective:save_matmul@2-3");
  CHECK(RecomputePlan::parse("uniform:2:reentrant@0-1+selective:mlp@2-3", 4).str() ==
        "chunk:reentrant@0-1+selective:mlp@2-3");
  // keep_last takes the last block out as from any region.
  const auto last = RecomputePlan::parse("per_block:reentrant+keep_last", 4);
  CHECK(last.block_regions == Groups{{0}, {1}, {2}});
  CHECK(last.region_reentrant == Reentrant{true, true, true});
  CHECK(last.str() == "per_block:reentrant@0-2");
  CHECK(RecomputePlan::parse("chunk:reentrant+keep_last", 4).str() == "chunk:reentrant@0-2");
  // Equality: reentrant or not counts.
  CHECK_FALSE(RecomputePlan::parse("per_block:reentrant", 4) == RecomputePlan::parse("per_block", 4));
  CHECK(RecomputePlan::parse("uniform:2:reentrant", 4) ==
        RecomputePlan::parse("chunk:reentrant@2-3+chunk:reentrant@0-1", 4));
  for (const std::string spec :
       {"per_block:reentrant", "chunk:reentrant", "uniform:2:reentrant", "uniform:3:reentrant@1-7", "block:3:reentrant",
        "selected:1,3,4:reentrant", "per_block:reentrant+keep_last", "per_block:reentrant@0-3+per_block@4-7",
        "per_block@0-1+per_block:reentrant@2-3+selective:save_matmul@4-7",
        "uniform:2:reentrant@0-3+selective:mlp@4-7+offload:core_attn@4-7", "per_block:reentrant+offload+compress:fp8",
        "per_block:reentrant+dynamic:1000000+chunked_loss", "chunk:reentrant@1-2+keep_gathered"}) {
    INFO(spec);
    const auto plan = RecomputePlan::parse(spec, 8);
    INFO("printed: " << plan.str());
    CHECK(RecomputePlan::parse(plan.str(), 8) == plan);
    CHECK(RecomputePlan::parse(plan.str(), 8).str() == plan.str());
  }

  using Catch::Contains;
  CHECK_THROWS_WITH(RecomputePlan::parse("selective:save_matmul:reentrant", 4),
                    Contains("'selective:save_matmul:reentrant': a reentrant region cannot hold an op policy"));
  CHECK_THROWS_WITH(RecomputePlan::parse("selective:save_ops=matmul:reentrant@0-1", 4),
                    Contains("'selective:save_ops=matmul:reentrant@0-1': a reentrant region cannot hold an op policy"));
  CHECK_THROWS_WITH(RecomputePlan::parse("attention:reentrant", 4),
                    Contains("'attention:reentrant': module regions (attention) are non-reentrant only"));
  CHECK_THROWS_WITH(RecomputePlan::parse("selective:mlp,layernorm:reentrant", 4),
                    Contains("module regions (selective:mlp,layernorm) are non-reentrant only"));
  for (const std::string other : {"none", "keep_last", "offload", "offload:mlp", "compress:fp8", "dynamic",
                                  "chunked_loss", "keep_gathered", "uniform", "per_block:reentrant"})
    CHECK_THROWS_WITH(RecomputePlan::parse("per_block@0+" + other + ":reentrant", 4),
                      Contains("'" + other + ":reentrant': :reentrant is for block-level regions only") &&
                          Contains("not '" + other + "'"));
  CHECK_THROWS_WITH(RecomputePlan::parse("per_block:reentrant+per_block@1", 4),
                    Contains("'per_block:reentrant' and 'per_block@1' overlap at block 1"));
  CHECK_THROWS_WITH(RecomputePlan::parse("per_block:reentrant@0-1+attention@1-3", 4),
                    Contains("module regions would nest inside the block's region"));
  CHECK_THROWS_WITH(RecomputePlan::parse("per_block@0-1:reentrant", 4),
                    Contains("'per_block@0-1:reentrant'") && Contains("expects a non-negative integer"));
  // The valid forms name it.
  CHECK_THROWS_WITH(RecomputePlan::parse("per_blok:reentrant", 4),
                    Contains("not 'per_blok'") && Contains("per_block:reentrant, uniform:2:reentrant@0-3"));
}

TEST_CASE("reentrant regions over MoE blocks return the router losses as outputs", "[checkpoint][plan]") {
  // tiny-moe: block 0 dense, blocks 1-3 MoE. The decoder's stack has the
  // MoE terms channel, so these plans are taken (the dumps and the LoRA
  // tests check their bits against none).
  DecoderModel moe(ModelConfig::named("tiny-moe"), 0);
  for (const std::string plan : {"per_block:reentrant", "chunk:reentrant@0-1+per_block@2-3",
                                 "per_block:reentrant@0+per_block@1-3"}) {
    apply_recompute_plan(moe, RecomputePlan::parse(plan, 4));
    CHECK(moe.model->blocks->plan().str() == plan);
  }
}

TEST_CASE("reentrant plans run reentrant regions: gradients of none, frozen embedding or not", "[checkpoint][plan]") {
  // A tiny decoder, one forward and backward a plan; with the embedding
  // frozen, block 0's region has no input that requires grad (its
  // parameters get their gradients from the region's own backward). Every
  // plan gives none's gradients bit for bit, and the frozen weight none.
  const ModelConfig c = memory_config(4);
  const std::string embed = "model.embed_tokens.weight";
  auto grads = [&](const std::string& plan, bool frozen) {
    DecoderModel m(c, 1);
    apply_recompute_plan(m, RecomputePlan::parse(plan, c.n_layers));
    if (frozen) m.parameter(embed).set_requires_grad(false);
    reset_checkpoint_counters();
    m.forward_loss(batch_for(c)).loss.backward();
    std::map<std::string, std::vector<float>> g;
    for (const auto& [name, p] : m.named_parameters())
      if (p.grad().defined()) g[name] = p.grad().to_vector<float>();
    return std::make_pair(g, checkpoint_counters().replays);
  };
  for (bool frozen : {false, true}) {
    INFO("embedding frozen " << frozen);
    const auto none = grads("none", frozen);
    CHECK(none.first.count(embed) == !frozen);
    CHECK(none.first.size() > 10);
    CHECK(none.second == 0);
    for (const std::string plan : {"per_block", "per_block:reentrant", "uniform:2:reentrant", "chunk:reentrant",
                                   "per_block:reentrant@0-1+selective:save_matmul@2-3", "per_block:reentrant+keep_last"}) {
      INFO(plan);
      const auto got = grads(plan, frozen);
      CHECK(got.first == none.first);  // the same parameters, the same bits
      CHECK(got.second == std::int64_t(RecomputePlan::parse(plan, c.n_layers).block_regions.size()));
    }
  }
}
