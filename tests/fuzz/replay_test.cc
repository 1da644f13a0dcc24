// Replays every committed fuzz input through its target (targets.h): the
// seed corpus (tests/fuzz/corpus/<target>/) and the inputs of past findings
// (tests/fuzz/crashes/<target>/), so the normal suite keeps each fixed
// finding fixed without clang. Run from the repository root (tools/run_tests.sh
// does). The regression cases below state what each past finding must give
// now.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/plan.h"
#include "engine/error.h"
#include "engine/json.h"
#include "models/config.h"
#include "tests/fuzz/targets.h"

namespace fs = std::filesystem;

namespace {

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<fs::path> inputs_in(const fs::path& dir) {
  std::vector<fs::path> out;
  if (fs::is_directory(dir))
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("every committed fuzz input replays through its target without a finding") {
  REQUIRE(remat::fuzz::targets().size() == 10);
  for (const auto& t : remat::fuzz::targets()) {
    const auto seeds = inputs_in(fs::path("tests/fuzz/corpus") / t.name);
    INFO("target " << t.name << " (run from the repository root)");
    CHECK(seeds.size() >= 3);
    auto all = seeds;
    for (const auto& p : inputs_in(fs::path("tests/fuzz/crashes") / t.name)) all.push_back(p);
    int accepted = 0;
    for (const auto& p : all) {
      const std::string bytes = read_all(p);
      INFO("input " << p.string() << " (" << bytes.size() << " bytes)");
      bool ok = false;
      CHECK_NOTHROW(ok = t.run(bytes));
      accepted += ok;
    }
    // The seeds reach past the first checks: most are valid inputs.
    CHECK(accepted >= 3);
  }
}

TEST_CASE("the safetensors seeds with checksums are accepted (they exercise the verification)") {
  for (const char* name : {"checksummed.safetensors", "checksummed_one.safetensors", "mixed.safetensors"}) {
    INFO(name);
    CHECK(remat::fuzz::safetensors(read_all(fs::path("tests/fuzz/corpus/safetensors") / name)));
  }
  // One flipped data byte in a checksummed seed: rejected with a typed error.
  std::string bytes = read_all("tests/fuzz/corpus/safetensors/checksummed_one.safetensors");
  REQUIRE(bytes.size() > 4);
  bytes[bytes.size() - 2] ^= 0x10;
  CHECK_FALSE(remat::fuzz::safetensors(bytes));
}

// Found by the plan target: a block number past int64 escaped as
// std::out_of_range from std::stoll instead of a remat::Error.
TEST_CASE("recompute plan: a block number too large for int64 is a typed error naming it") {
  for (const std::string spec : {"block:8777777777777777777777777", "uniform:99999999999999999999",
                                 "selected:0,18446744073709551616", "per_block+selected:92233720368547758070"}) {
    INFO(spec);
    CHECK_THROWS_AS(remat::RecomputePlan::parse(spec, 4), remat::Error);
    CHECK_THROWS_WITH(remat::RecomputePlan::parse(spec, 4), Catch::Contains("is too large") && Catch::Contains(spec));
  }
  // The largest int64 still parses as a number (and is then out of range).
  CHECK_THROWS_WITH(remat::RecomputePlan::parse("block:9223372036854775807", 4), Catch::Contains("block:N needs N <= 4"));
}

// Found by the config target: non-finite values (JSON 1e999 read as inf by
// the first parser) were accepted, and the state's saved config (JSON has no
// inf) then failed to load back on resume. Values that make the model NaN
// are refused too.
TEST_CASE("model config: float fields must be finite and in range") {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<std::function<void(remat::ModelConfig&)>, std::string>> non_finite = {
      {[&](auto& c) { c.norm_eps = inf; }, "norm_eps must be finite and >= 0, got inf"},
      {[&](auto& c) { c.rope_theta = -inf; }, "rope_theta must be finite and > 0, got -inf"},
      {[&](auto& c) { c.init_std = std::nan(""); }, "init_std must be finite and >= 0, got nan"},
      {[&](auto& c) { c.aux_coef = inf; }, "aux_coef must be finite and >= 0, got inf"},
      {[&](auto& c) { c.z_coef = std::nan(""); }, "z_coef must be finite and >= 0, got nan"},
  };
  for (const auto& [set, why] : non_finite) {
    INFO(why);
    auto c = remat::ModelConfig::named("tiny");
    set(c);
    CHECK_THROWS_WITH(c.validate(), Catch::Contains(why) && Catch::Contains("invalid config 'tiny'"));
  }
  auto moe = remat::ModelConfig::named("tiny-moe");
  moe.capacity_factor = inf;
  CHECK_THROWS_WITH(moe.validate(), Catch::Contains("capacity_factor must be finite and >= 0"));

  const std::vector<std::pair<std::string, std::string>> out_of_range = {
      {R"({"rope_theta": 0})", "rope_theta must be finite and > 0, got 0"},
      {R"({"init_std": -0.5})", "init_std must be finite and >= 0, got -0.5"},
      {R"({"norm_eps": -1e-5})", "norm_eps must be finite and >= 0, got -1e-05"},
      {R"({"z_coef": -1})", "z_coef must be finite and >= 0, got -1"},
  };
  for (const auto& [text, why] : out_of_range) {
    INFO(text);
    CHECK_THROWS_AS(remat::ModelConfig::from_json(remat::Json::parse(text)), remat::Error);
    CHECK_THROWS_WITH(remat::ModelConfig::from_json(remat::Json::parse(text)), Catch::Contains(why));
  }
  // In range: accepted, and the written config loads back equal.
  const auto c = remat::ModelConfig::from_json(remat::Json::parse(R"({"norm_eps": 0, "z_coef": 0.001})"));
  CHECK(remat::ModelConfig::from_json(remat::Json::parse(c.to_json().dump())).to_json().dump() == c.to_json().dump());
}
