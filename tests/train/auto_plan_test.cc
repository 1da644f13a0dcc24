// The planner's profile and choice (train/auto_plan.h) on the tiny configs:
// what it measures is self-consistent, the plan it chooses for a budget fits
// that budget when run in a fresh model, and its predicted peak is within 5%
// of the measured one; budget texts and the error below the smallest peak.
#include <catch2/catch.hpp>

#include "checkpoint/plan.h"
#include "engine/allocator.h"
#include "engine/error.h"
#include "engine/rng.h"
#include "models/decoder.h"
#include "models/recompute.h"
#include "train/auto_plan.h"
#include "train/data.h"
#include "train/optimizer.h"

using namespace remat;

namespace {

// Lossless candidates whose memory does not depend on I/O timing (offload's
// queue does), so the measured peaks are exact and repeatable.
ProfileOptions tiny_options(const std::string& config) {
  ProfileOptions o;
  o.config = ModelConfig::load(config);
  o.rounds = 2;
  o.candidates = {"per_block", "attention", "selective:mlp", "selective:save_matmul"};
  if (o.config.experts > 0) o.candidates.push_back("moe_expert");
  return o;
}

// The peak allocated bytes of training steps 2 to 4 of `plan` in a fresh
// model (the first creates the optimizer state), as the bench worker runs it.
std::int64_t measured_peak(const ModelConfig& c, const std::string& plan) {
  manual_seed(0);
  DecoderModel model(c, 0);
  apply_recompute_plan(model, RecomputePlan::parse(plan, c.n_layers));
  AdamW opt(model.named_parameters());
  Corpus corpus = generated_corpus(0, std::int64_t(1) << 20, c.seq + 2);
  BatchSampler sampler(corpus.train, c.batch, c.seq, 1);
  auto& alloc = allocator_for(kCPU);
  std::int64_t peak = 0;
  for (int step = 0; step < 4; ++step) {
    Tensor batch = sampler.next();
    model.zero_grad();
    alloc.reset_peak();
    {
      Tensor loss = model.forward_loss(batch).loss;
      loss.backward();
    }
    clip_grad_norm(model.parameters(), 1.0);
    opt.step(1e-3);
    if (step > 0) peak = std::max(peak, alloc.stats().allocated_peak);
  }
  return peak;
}

}  // namespace

TEST_CASE("auto plan: the profile's tables are consistent with what it measured", "[auto_plan]") {
  const PlanProfile p = profile_plans(tiny_options("tiny"));
  const ModelConfig c = ModelConfig::load("tiny");
  REQUIRE(p.n_blocks == c.n_layers);
  REQUIRE(p.candidates.size() == 5);
  CHECK(p.candidates[0].component.empty());
  CHECK(p.candidates[0].plan == "none");
  CHECK(p.persistent > 0);
  CHECK(p.none_peak > p.persistent);
  // The traced none step: every block saved something, and the saves were released.
  std::vector<std::int64_t> per_block(std::size_t(c.n_layers), 0);
  for (const auto& s : p.saves) {
    CHECK(s.bytes >= 0);
    if (s.block >= 0) per_block.at(std::size_t(s.block)) += s.bytes;
    CHECK(s.released_at > s.saved_at);
  }
  for (auto b : per_block) CHECK(b > 0);
  const auto& keep = p.candidates[0].blocks;
  const auto& region = p.candidates[1].blocks;  // per_block
  for (std::int64_t i = 0; i < p.n_blocks; ++i) {
    const auto u = std::size_t(i);
    CHECK(keep[u].time_ms == 0.0);
    // A region holds its input only: far less than the block's saves, and
    // its backward regenerates them.
    CHECK(region[u].held * 4 < keep[u].held);
    CHECK(region[u].work > keep[u].work);
    CHECK(region[u].time_ms >= 0.0);
  }
  // Each candidate on every block: the model's peak is the measured one.
  for (const auto& cand : p.candidates) {
    INFO(cand.plan);
    const PlannerInput in = p.planner_input(std::int64_t(1) << 40, false);
    std::vector<std::size_t> pick;
    for (std::int64_t i = 0; i < p.n_blocks; ++i) {
      const auto& cs = in.choices[std::size_t(i)];
      std::size_t k = 0;
      while (k < cs.size() && cs[k].component != cand.component) ++k;
      REQUIRE(k < cs.size());
      pick.push_back(k);
    }
    const double pred = double(predicted_peak(in, pick)), meas = double(cand.peak);
    CHECK(std::abs(pred - meas) <= 0.02 * meas);
  }
}

TEST_CASE("auto plan: checked plans fit their budgets, predicted peaks within 5%", "[auto_plan]") {
  for (const char* config : {"tiny", "tiny-moe"}) {
    const ModelConfig c = ModelConfig::load(config);
    const PlanProfile p = profile_plans(tiny_options(config));
    const PlannerResult lean = smallest_peak_plan(p.planner_input(p.none_peak, false));
    for (const char* b : {"30%", "50%", "75%", "110%"}) {
      const std::int64_t budget = parse_memory_budget(b, p);
      INFO(config << " budget " << b << " = " << budget << ", smallest predicted peak " << lean.peak);
      if (budget < lean.peak + lean.peak / 50) continue;  // below what any plan reaches (checked below)
      // As train and bench choose: the solver's plan, measured, and chosen
      // again if it overshot (a mixed plan's prediction can miss by a few
      // percent, more than the margin: seen at 2.3% on tiny-moe).
      const CheckedPlan checked = choose_checked_plan(p, tiny_options(config), budget, false);
      const AutoPlan& a = checked.plan;
      INFO("chosen " << a.best.plan << " predicted peak " << a.best.peak << " after " << checked.tries << " tries");
      CHECK(checked.checked);
      CHECK(a.best.peak <= a.planned_budget);
      // The answer is a plan string --recompute accepts, and it round-trips.
      const RecomputePlan parsed = RecomputePlan::parse(a.best.plan, c.n_layers);
      CHECK(RecomputePlan::parse(parsed.str(), c.n_layers) == parsed);
      const std::int64_t meas = measured_peak(c, a.best.plan);
      CHECK(meas <= budget);
      CHECK(std::abs(double(a.best.peak - meas)) <= 0.05 * double(meas));
      // Room for everything: keep everything (a plan timed as fast as none
      // ties with it, and ties keep).
      if (std::string(b) == "110%") CHECK(a.best.plan == "none");
    }
  }
}

TEST_CASE("auto plan: budget texts and the error below the smallest peak", "[auto_plan]") {
  PlanProfile p;
  p.persistent = 1000;
  p.none_peak = 3000;
  CHECK(parse_memory_budget("50%", p) == 2000);
  CHECK(parse_memory_budget("0%", p) == 1000);
  CHECK(parse_memory_budget("1.5GiB", p) == std::int64_t(1536) << 20);
  CHECK(parse_memory_budget("700MiB", p) == std::int64_t(700) << 20);
  CHECK(parse_memory_budget("2GB", p) == 2000000000);
  CHECK(parse_memory_budget("123456", p) == 123456);
  for (const char* bad : {"", "abc", "12 parsecs", "-5%", "5TiB", "nan"}) {
    INFO(bad);
    CHECK_THROWS_WITH(parse_memory_budget(bad, p), Catch::Contains("--memory-budget") && Catch::Contains("N%"));
  }

  const PlanProfile q = profile_plans(tiny_options("tiny"));
  try {
    choose_plan(q, q.persistent, false);
    FAIL("a budget of the persistent bytes alone fits no plan");
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK(m.find("no plan fits") != std::string::npos);
    CHECK(m.find("smallest predicted peak") != std::string::npos);
    CHECK(m.find("--recompute ") != std::string::npos);
  }
}

TEST_CASE("auto plan: a checked choice fits when run, offload among the candidates", "[auto_plan]") {
  for (const char* config : {"tiny", "tiny-moe"}) {
    ProfileOptions o;
    o.config = ModelConfig::load(config);
    o.rounds = 1;  // default candidates: offload and per_block+offload too
    const PlanProfile p = profile_plans(o);
    for (const char* b : {"60%", "80%"}) {
      const std::int64_t budget = parse_memory_budget(b, p);
      const CheckedPlan r = choose_checked_plan(p, o, budget, false);
      INFO(config << " " << b << ": " << r.plan.best.plan << " predicted " << r.plan.best.peak << " measured "
                  << r.measured_peak << " budget " << budget << " tries " << r.tries);
      CHECK(r.tries >= 1);
      CHECK(r.tries <= 3);
      CHECK(r.measured_peak <= budget);
      CHECK(r.checked == (r.measured_peak <= r.plan.budget - std::int64_t(double(r.plan.budget) * r.plan.margin)));
    }
  }
}


TEST_CASE("auto plan: when every choice overshoots when run, a simpler plan that fits is still taken",
          "[auto_plan]") {
  // The runs' peaks are scripted: every plan overshoots the budget except
  // the first choice's smallest-peak plan. The re-choices (the overshoot
  // planned away, then without offload) are refused in turn; the fallbacks
  // (the first choice's alternatives, then its smallest-peak plan) take the
  // first seen to fit instead of leaving no plan.
  ProfileOptions o;
  o.config = ModelConfig::load("tiny");
  o.rounds = 1;
  const PlanProfile p = profile_plans(o);
  const std::int64_t budget = parse_memory_budget("60%", p);
  const AutoPlan first = choose_plan(p, budget, false);
  REQUIRE(first.smallest.plan != first.best.plan);
  std::vector<std::string> runs;
  const std::int64_t fits = first.planned_budget - 1, over = budget + (1 << 20);
  const CheckedPlan r = choose_checked_plan(p, o, budget, false, [&](const std::string& plan) {
    runs.push_back(plan);
    return plan == first.smallest.plan ? fits : over;
  });
  INFO("first " << first.best.plan << ", smallest " << first.smallest.plan << ", runs " << runs.size());
  CHECK(r.checked);
  CHECK(r.plan.best.plan == first.smallest.plan);
  CHECK(r.measured_peak == fits);
  REQUIRE(!runs.empty());
  CHECK(runs.front() == first.best.plan);  // the first choice is run first
  CHECK(runs.back() == first.smallest.plan);
  CHECK(r.history.size() == runs.size());
  CHECK(runs.size() <= 3 + 3);  // the tries, then at most three fallbacks
  for (std::size_t i = 0; i + 1 < runs.size(); ++i) CHECK(r.history[i].second == over);
}

TEST_CASE("auto plan: keep_gathered's measured change joins every choice where it saves time", "[auto_plan][zero]") {
  // A hand-made profile of four blocks under --zero 3: keeping (100 held),
  // per_block (10 held, 100 replayed, 5 ms); keeping a block's gathered
  // parameters holds 30 more and saves 1 ms, except on block 0 (no saving
  // measured: not offered).
  PlanProfile p;
  p.n_blocks = 4;
  p.moe_blocks.assign(4, false);
  p.persistent = 0;
  p.forward_base = p.block_forward_base = 50;
  p.backward_bases.assign(4, 50);
  p.none_step_ms = 100;
  p.none_peak = 450;
  ProfiledCandidate none, region;
  region.component = "per_block";
  for (int i = 0; i < 4; ++i) {
    none.blocks.push_back({"", 100, 0, 0.0});
    region.blocks.push_back({"per_block", 10, 100, 5.0});
  }
  p.candidates = {none, region};
  p.keep_gathered.measured = true;
  for (int i = 0; i < 4; ++i)
    p.keep_gathered.delta.push_back({"keep_gathered", 30, 0, i == 0 ? 0.0 : -1.0, false, kKeepGatheredHook});

  const PlannerInput in = p.planner_input(10000, false);
  CHECK(in.choices[0].size() == 2);
  for (int i = 1; i < 4; ++i) {
    REQUIRE(in.choices[std::size_t(i)].size() == 4);
    const PlanChoice& kept = in.choices[std::size_t(i)][3];
    CHECK(kept.component == "per_block+keep_gathered");
    CHECK(kept.held == 40);
    CHECK(kept.time_ms == 4.0);
    CHECK(kept.hooks == kKeepGatheredHook);
  }
  // Room for everything: blocks 1-3 keep their gathered parameters.
  AutoPlan a = choose_plan(p, 10000, false);
  CHECK(a.best.plan == "keep_gathered@1-3");
  CHECK(a.predicted_step_ms == 97.0);
  // The whole profile's smallest peak has no kept parameters.
  CHECK(a.smallest.plan.find("keep_gathered") == std::string::npos);
}
