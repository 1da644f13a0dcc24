// bench's plan lists: --recompute split into plans (a piece that starts no
// plan continues the previous one's list) and --pareto's plans.
#include "tools/bench_options.h"

#include <algorithm>
#include <catch2/catch.hpp>

using remat::ModelConfig;
using remat::tools::pareto_plans;
using remat::tools::split_plans;
using Plans = std::vector<std::string>;

TEST_CASE("split_plans keeps a plan's own commas", "[bench]") {
  CHECK(split_plans("none,per_block") == Plans{"none", "per_block"});
  CHECK(split_plans("none,chunked_loss,keep_gathered@1") == Plans{"none", "chunked_loss", "keep_gathered@1"});
  CHECK(split_plans("none,selected:0,2,per_block") == Plans{"none", "selected:0,2", "per_block"});
  CHECK(split_plans("selective:mlp,layernorm,offload:mlp,core_attn,auto") ==
        Plans{"selective:mlp,layernorm", "offload:mlp,core_attn", "auto"});
  CHECK(split_plans("2,none") == Plans{"2", "none"});  // a first piece always starts a plan
}

TEST_CASE("pareto_plans: the hand plans, those with offload, then auto", "[bench]") {
  const ModelConfig c = ModelConfig::named("tiny");  // 4 blocks
  const Plans p = pareto_plans(c);
  REQUIRE(!p.empty());
  CHECK(p.front() == "none");
  CHECK(p.back() == "auto");
  CHECK(std::count(p.begin(), p.end(), "offload") == 1);
  CHECK(std::count(p.begin(), p.end(), "per_block+offload") == 1);
  CHECK(std::count(p.begin(), p.end(), "uniform:2") == 1);
  CHECK(std::count(p.begin(), p.end(), "uniform:4") == 0);  // uniform:4 over 4 blocks is chunk
  for (const char* b : {"block:1", "block:2", "block:3"}) CHECK(std::count(p.begin(), p.end(), b) == 1);
}
