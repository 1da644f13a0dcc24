// The memory-budget solver (checkpoint/planner.h) on synthetic cost tables:
// against brute force over every combination, on a hand-checked example,
// and the plan strings it writes.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "checkpoint/plan.h"
#include "checkpoint/planner.h"

using namespace remat;

namespace {

// True if the blocks whose choices use `hook` form one run (or none).
bool contiguous(const PlannerInput& in, const std::vector<std::size_t>& c, unsigned hook) {
  int runs = 0;
  bool prev = false;
  for (std::size_t i = 0; i < c.size(); ++i) {
    const bool on = (in.choices[i][c[i]].hooks & hook) != 0;
    if (on && !prev) ++runs;
    prev = on;
  }
  return runs <= 1;
}

// True if the blocks whose choices use `hook` are the last ones (or none):
// keep_gathered's ranges (planner.h).
bool suffix(const PlannerInput& in, const std::vector<std::size_t>& c, unsigned hook) {
  bool seen = false;
  for (std::size_t i = 0; i < c.size(); ++i) {
    const bool on = (in.choices[i][c[i]].hooks & hook) != 0;
    if (seen && !on) return false;
    seen = seen || on;
  }
  return true;
}

// Every combination of choices: the least time within the budget (and the
// least peak overall), offload and compression each on one run of blocks.
struct Brute {
  bool feasible = false;
  double time = 0;
  std::int64_t min_peak = -1;
};
Brute brute_force(const PlannerInput& in) {
  Brute b;
  std::vector<std::size_t> c(in.choices.size(), 0);
  for (;;) {
    bool ok = true;
    double t = 0;
    for (std::size_t i = 0; i < c.size(); ++i) {
      ok = ok && (in.allow_lossy || !in.choices[i][c[i]].lossy);
      t += in.choices[i][c[i]].time_ms;
    }
    ok = ok && contiguous(in, c, kOffloadHook) && contiguous(in, c, kCompressHook) && suffix(in, c, kKeepGatheredHook);
    if (ok) {
      const std::int64_t p = predicted_peak(in, c);
      if (b.min_peak < 0 || p < b.min_peak) b.min_peak = p;
      if (p <= in.budget && (!b.feasible || t < b.time)) {
        b.feasible = true;
        b.time = t;
      }
    }
    std::size_t i = 0;
    while (i < c.size() && ++c[i] == in.choices[i].size()) c[i++] = 0;
    if (i == c.size()) break;
  }
  return b;
}

}  // namespace

TEST_CASE("planner: the dynamic program finds brute force's optimum", "[planner]") {
  std::mt19937_64 rng(12345);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const char* comps[] = {"", "per_block", "offload", "compress:fp8", "attention", "per_block+keep_gathered"};
  int feasible_cases = 0;
  for (int trial = 0; trial < 400; ++trial) {
    PlannerInput in;
    const int L = uni(1, 6);
    in.forward_base = uni(0, 300);
    in.backward_base = uni(0, 300);
    in.allow_lossy = trial % 2 == 0;
    // Half the trials: per-block backward bases, forward peaks, a fixed term.
    const bool rich = trial % 4 >= 2;
    if (rich) {
      for (int i = 0; i < L; ++i) in.backward_bases.push_back(uni(0, 300));
      in.block_forward_base = uni(0, 300);
      in.fixed_peak = uni(0, 400);
    }
    for (int i = 0; i < L; ++i) {
      std::vector<PlanChoice> opts;
      const int k = uni(1, trial % 5 == 4 ? 6 : 4);  // (every fifth trial: keep_gathered, which saves time)
      for (int j = 0; j < k; ++j) {
        PlanChoice c;
        c.component = comps[j];
        c.held = uni(0, 200);
        c.work = uni(0, 200);
        c.time_ms = j == 0 ? 0.0 : j == 5 ? -double(uni(0, 20)) / 4 : double(uni(1, 50)) / 4;
        c.lossy = j == 3 && trial % 3 == 0;
        c.hooks = j == 2 ? kOffloadHook : j == 3 ? kCompressHook : j == 5 ? kKeepGatheredHook : 0u;
        if (rich) c.forward_work = uni(0, 250);
        opts.push_back(c);
      }
      opts[0].lossy = false;  // keeping is always allowed
      in.choices.push_back(opts);
    }
    in.budget = uni(200, 1500);
    in.grid_bytes = 1;  // exact
    const Brute want = brute_force(in);
    const PlannerResult got = solve_plan(in);
    INFO("trial " << trial);
    REQUIRE(got.feasible == want.feasible);
    if (!want.feasible) continue;
    ++feasible_cases;
    CHECK(got.time_ms == Approx(want.time).margin(1e-9));
    CHECK(got.peak <= in.budget);
    CHECK(got.peak == predicted_peak(in, got.choice));
    const PlannerResult lean = smallest_peak_plan(in);
    CHECK(lean.peak <= want.min_peak + std::max<std::int64_t>(1, want.min_peak / 1000));
  }
  CHECK(feasible_cases > 100);
}

TEST_CASE("planner: a hand-checked stack, the last block kept, plan strings", "[planner]") {
  // Four equal blocks: keeping costs 100 bytes held and no time; a region
  // holds 10 (its boundary) but its backward replays the block (work 100)
  // and costs 5 ms. Base 50 both ways.
  PlannerInput in;
  in.forward_base = in.backward_base = 50;
  for (int i = 0; i < 4; ++i) in.choices.push_back({{"", 100, 0, 0.0}, {"per_block", 10, 100, 5.0}});
  in.budget = 1000;
  PlannerResult r = solve_plan(in);
  CHECK(r.plan == "none");
  CHECK(r.peak == 450);
  // 280: two regions (peak at the end of the forward: 50 + 10 + 10 + 100 +
  // 100 = 270) and the last block kept (no replay: the planner finds keep_last).
  in.budget = 280;
  r = solve_plan(in);
  CHECK(r.feasible);
  CHECK(r.time_ms == 10.0);
  CHECK(r.peak <= 280);
  CHECK(r.choice.back() == 0);  // the last block keeps its saves
  CHECK(RecomputePlan::parse(r.plan, 4).block_regions.size() == 2);
  // Below every plan's peak: infeasible, and the smallest peak is the all-regions plan's.
  in.budget = 100;
  CHECK(!solve_plan(in).feasible);
  const PlannerResult lean = smallest_peak_plan(in);
  // All four as regions peak at block 3's backward: 50 + 30 + 10 + 100 = 190;
  // keeping block 3 peaks at 50 + 30 + 100 = 180 (forward end and its backward).
  CHECK(lean.peak == 180);
  CHECK(lean.plan == "per_block@0-2");

  // Plan strings: runs of one component get one range; multi-part components
  // get the range on each part; the result parses, and is in canonical order
  // (RecomputePlan::str(): block regions, module regions, hooks).
  std::vector<std::vector<PlanChoice>> ch(6, {{"", 0, 0, 0}, {"per_block", 0, 0, 0}, {"per_block+offload", 0, 0, 0},
                                             {"selective:mlp", 0, 0, 0}});
  CHECK(plan_string(ch, {1, 1, 1, 1, 1, 1}) == "per_block");
  CHECK(plan_string(ch, {0, 0, 0, 0, 0, 0}) == "none");
  const std::string s = plan_string(ch, {2, 2, 1, 3, 3, 0});
  CHECK(s == "per_block@0-2+selective:mlp@3-4+offload@0-1");
  CHECK(s == RecomputePlan::parse(s, 6).str());
  // A hook part keeps its range even over every block; parts split into runs.
  CHECK(plan_string(ch, {2, 2, 2, 2, 2, 2}) == "per_block+offload@0-5");
  CHECK(plan_string(ch, {1, 3, 1, 1, 0, 1}) == "per_block@0+per_block@2-3+per_block@5+selective:mlp@1");
  CHECK(RecomputePlan::parse("per_block@0+per_block@2-3+per_block@5+selective:mlp@1", 6).block_regions.size() == 4);
  const RecomputePlan p = RecomputePlan::parse(s, 6);
  CHECK(p.block_regions.size() == 3);
  CHECK(p.block_modules[4].count("mlp") == 1);
  CHECK(p.offload_range == std::make_pair(std::int64_t(0), std::int64_t(1)));
}

TEST_CASE("planner: keep_gathered on the last blocks, where the budget leaves room", "[planner][zero]") {
  // Four equal blocks under --zero 3: keeping costs 100 bytes held; keeping
  // a block's gathered parameters from its forward to its backward holds 30
  // more and saves 1 ms (its backward's gather).
  PlannerInput in;
  in.forward_base = in.backward_base = 50;
  for (int i = 0; i < 4; ++i)
    in.choices.push_back({{"", 100, 0, 0.0}, {"keep_gathered", 130, 0, -1.0, false, kKeepGatheredHook}});
  in.budget = 1000;
  PlannerResult r = solve_plan(in);
  CHECK(r.plan == "keep_gathered");
  CHECK(r.time_ms == -4.0);
  CHECK(r.peak == 570);
  // 480: room for one block's 30 bytes; the solver keeps the last block's
  // (its kept parameters add to the fewest peaks).
  in.budget = 480;
  r = solve_plan(in);
  CHECK(r.plan == "keep_gathered@3");
  CHECK(r.peak == 480);
  CHECK(RecomputePlan::parse(r.plan, 4).keeps_gathered(3));
  CHECK(!RecomputePlan::parse(r.plan, 4).keeps_gathered(2));
  // 479: none at all.
  in.budget = 479;
  CHECK(solve_plan(in).plan == "none");
}
