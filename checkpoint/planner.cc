#include "checkpoint/planner.h"

#include "checkpoint/plan.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>

#include "engine/error.h"

namespace remat {

namespace {

std::int64_t backward_base_of(const PlannerInput& in, std::size_t i) {
  return in.backward_bases.empty() ? in.backward_base : in.backward_bases.at(i);
}

bool allowed(const PlannerInput& in, const PlanChoice& c) { return in.allow_lossy || !c.lossy; }

void check_input(const PlannerInput& in) {
  REMAT_CHECK(!in.choices.empty(), Error, "planner: no blocks to plan");
  REMAT_CHECK(in.backward_bases.empty() || in.backward_bases.size() == in.choices.size(), Error,
              "planner: ", in.backward_bases.size(), " backward bases for ", in.choices.size(), " blocks");
  for (std::size_t i = 0; i < in.choices.size(); ++i) {
    bool any = false;
    for (const auto& c : in.choices[i]) {
      any = any || allowed(in, c);
      REMAT_CHECK(c.held >= 0, Error, "planner: block ", i, " choice '", c.component, "' holds ", c.held,
                  " bytes (expected >= 0)");
    }
    REMAT_CHECK(any, Error, "planner: block ", i, " has no choice", in.allow_lossy ? "" : " that is lossless");
  }
}

bool is_hook_part(const std::string& part) { return part.rfind("offload", 0) == 0 || part.rfind("compress", 0) == 0; }

using Range = std::optional<std::pair<std::size_t, std::size_t>>;  // unset: the hook is not used

// Every range of blocks a hook could take: none, then each [a, b].
std::vector<Range> all_ranges(std::size_t L) {
  std::vector<Range> r{std::nullopt};
  for (std::size_t a = 0; a < L; ++a)
    for (std::size_t b = a; b < L; ++b) r.emplace_back(std::make_pair(a, b));
  return r;
}

// none, then each [a, L-1] (keep_gathered's: planner.h).
std::vector<Range> suffix_ranges(std::size_t L) {
  std::vector<Range> r{std::nullopt};
  for (std::size_t a = L; a-- > 0;) r.emplace_back(std::make_pair(a, L - 1));
  return r;
}

bool in(const Range& r, std::size_t i) { return r && i >= r->first && i <= r->second; }

// One range per hook (unset: not used).
struct HookRanges {
  Range off, comp, keep;
};

// The dynamic program for one range of each hook.
PlannerResult solve_ranged(const PlannerInput& in, const HookRanges& hr) {
  const Range &off = hr.off, &comp = hr.comp;
  PlannerResult res;
  if (in.budget < in.fixed_peak) return res;
  const std::int64_t grid = in.grid_bytes > 0 ? in.grid_bytes : std::max<std::int64_t>(1, in.budget / 4096);
  const std::int64_t units = std::max<std::int64_t>(0, in.budget) / grid;  // held bytes never exceed the budget
  const std::size_t L = in.choices.size(), U = std::size_t(units) + 1;
  const double inf = std::numeric_limits<double>::infinity();
  auto up = [grid](std::int64_t bytes) { return (bytes + grid - 1) / grid; };
  auto ok = [&](std::size_t i, const PlanChoice& c) {
    if (!allowed(in, c)) return false;
    // A ranged hook acts on every block of its range: inside it only the
    // choices that use it, outside only those that do not.
    if (((c.hooks & kOffloadHook) != 0) != remat::in(off, i)) return false;
    if (((c.hooks & kCompressHook) != 0) != remat::in(comp, i)) return false;
    if (((c.hooks & kKeepGatheredHook) != 0) != remat::in(hr.keep, i)) return false;
    return true;
  };
  // dp[S]: least time of blocks 0..i-1 whose held bytes, rounded up to the
  // grid block by block, sum to S units; from[i][S]: (S before block i, choice).
  std::vector<double> dp(U, inf), next(U);
  dp[0] = 0;
  std::vector<std::vector<std::pair<std::int32_t, std::int32_t>>> from(
      L, std::vector<std::pair<std::int32_t, std::int32_t>>(U, {-1, -1}));
  for (std::size_t i = 0; i < L; ++i) {
    std::fill(next.begin(), next.end(), inf);
    const std::int64_t bb = backward_base_of(in, i);
    for (std::size_t S = 0; S < U; ++S) {
      if (dp[S] == inf) continue;
      const std::int64_t before = std::int64_t(S) * grid;
      for (std::size_t k = 0; k < in.choices[i].size(); ++k) {
        const PlanChoice& c = in.choices[i][k];
        if (!ok(i, c)) continue;
        // Block i's forward, and its backward: everything before it, what it holds, what it needs.
        if (in.block_forward_base + before + c.forward_work > in.budget) continue;
        if (bb + before + c.held + c.work > in.budget) continue;
        const std::int64_t S2 = std::int64_t(S) + up(c.held);
        if (S2 >= std::int64_t(U)) continue;
        const double t = dp[S] + c.time_ms;
        if (t < next[std::size_t(S2)]) {
          next[std::size_t(S2)] = t;
          from[i][std::size_t(S2)] = {std::int32_t(S), std::int32_t(k)};
        }
      }
    }
    dp.swap(next);
  }
  // The forward-end peak, then the least time; on a tie the most held (the
  // least recomputed).
  std::int64_t best = -1;
  for (std::size_t S = 0; S < U; ++S)
    if (dp[S] < inf && in.forward_base + std::int64_t(S) * grid <= in.budget &&
        (best < 0 || dp[S] <= dp[std::size_t(best)]))
      best = std::int64_t(S);
  if (best < 0) return res;
  res.choice.assign(L, 0);
  std::int64_t S = best;
  for (std::size_t i = L; i-- > 0;) {
    const auto [prev, k] = from[i][std::size_t(S)];
    res.choice[i] = std::size_t(k);
    S = prev;
  }
  res.feasible = true;
  res.peak = predicted_peak(in, res.choice);
  for (std::size_t i = 0; i < L; ++i) res.time_ms += in.choices[i][res.choice[i]].time_ms;
  res.plan = plan_string(in.choices, res.choice);
  return res;
}

}  // namespace

std::int64_t predicted_peak(const PlannerInput& in, const std::vector<std::size_t>& choice) {
  std::int64_t prefix = 0, peak = in.fixed_peak;
  for (std::size_t i = 0; i < in.choices.size(); ++i) {
    const PlanChoice& c = in.choices[i].at(choice.at(i));
    peak = std::max(peak, in.block_forward_base + prefix + c.forward_work);
    peak = std::max(peak, backward_base_of(in, i) + prefix + c.held + c.work);
    prefix += c.held;
  }
  return std::max(peak, in.forward_base + prefix);
}

std::string plan_string(const std::vector<std::vector<PlanChoice>>& choices, const std::vector<std::size_t>& choice) {
  const std::size_t n = choices.size();
  // Each part's blocks, parts in order of first use.
  std::vector<std::string> order;
  std::map<std::string, std::vector<bool>> blocks;
  for (std::size_t b = 0; b < n; ++b) {
    const std::string& comp = choices[b].at(choice.at(b)).component;
    std::size_t start = 0;
    while (!comp.empty() && start <= comp.size()) {
      const std::size_t plus = comp.find('+', start);
      const std::string part = comp.substr(start, plus == std::string::npos ? std::string::npos : plus - start);
      if (!blocks.count(part)) {
        order.push_back(part);
        blocks[part].assign(n, false);
      }
      blocks[part][b] = true;
      if (plus == std::string::npos) break;
      start = plus + 1;
    }
  }
  std::string out;
  for (const auto& part : order) {
    const auto& on = blocks[part];
    for (std::size_t b = 0; b < n;) {
      if (!on[b]) {
        ++b;
        continue;
      }
      std::size_t e = b;
      while (e + 1 < n && on[e + 1]) ++e;
      const bool whole = b == 0 && e == n - 1 && !is_hook_part(part);
      out += (out.empty() ? "" : "+") + part +
             (whole ? "" : "@" + std::to_string(b) + (e == b ? "" : "-" + std::to_string(e)));
      b = e + 1;
    }
  }
  if (out.empty()) return "none";
  // In canonical order (RecomputePlan::str()), as a dump records the plan it ran.
  try {
    return RecomputePlan::parse(out, std::int64_t(n)).str();
  } catch (const Error&) {
    return out;  // parts named by a user's blocks: as built
  }
}

PlannerResult solve_plan(const PlannerInput& in) {
  check_input(in);
  const std::size_t L = in.choices.size();
  unsigned used = 0;
  for (const auto& cs : in.choices)
    for (const auto& c : cs)
      if (allowed(in, c)) used |= c.hooks;
  const std::vector<Range> every = all_ranges(L);
  const std::vector<Range> none{std::nullopt};
  const std::vector<Range>& offs = (used & kOffloadHook) ? every : none;
  std::vector<Range> comps = (used & kCompressHook) ? every : none;
  std::vector<Range> keeps = (used & kKeepGatheredHook) ? suffix_ranges(L) : none;
  const Range whole = std::make_pair(std::size_t(0), L - 1);
  if (offs.size() * comps.size() * keeps.size() > 4096 && comps.size() > 1) comps = {std::nullopt, whole};
  if (offs.size() * comps.size() * keeps.size() > 4096 && keeps.size() > 1) keeps = {std::nullopt, whole};
  PlannerResult best;
  for (const auto& o : offs)
    for (const auto& c : comps)
      for (const auto& k : keeps) {
        PlannerResult r = solve_ranged(in, {o, c, k});
        if (r.feasible && (!best.feasible || r.time_ms < best.time_ms - 1e-9 ||
                           (r.time_ms <= best.time_ms + 1e-9 && r.peak < best.peak)))
          best = std::move(r);
      }
  return best;
}

PlannerResult smallest_peak_plan(const PlannerInput& in) {
  check_input(in);
  // An upper bound: every block's smallest-footprint lossless-or-allowed
  // choice that needs no hook range (hooks may not be combinable freely).
  std::vector<std::size_t> lean(in.choices.size(), 0);
  for (std::size_t i = 0; i < in.choices.size(); ++i) {
    std::int64_t bestv = -1;
    for (std::size_t k = 0; k < in.choices[i].size(); ++k) {
      const auto& c = in.choices[i][k];
      if (!allowed(in, c) || c.hooks) continue;
      if (bestv < 0 || c.held + c.work < bestv) {
        bestv = c.held + c.work;
        lean[i] = k;
      }
    }
    if (bestv < 0)  // only hook choices: the first allowed one
      for (std::size_t k = 0; k < in.choices[i].size(); ++k)
        if (allowed(in, in.choices[i][k])) {
          lean[i] = k;
          break;
        }
  }
  std::int64_t hi = predicted_peak(in, lean), lo = 0;
  PlannerInput probe = in;
  PlannerResult best;
  // The least feasible budget, to 1/1000 of it (the grid is finer than that).
  while (hi - lo > std::max<std::int64_t>(1, hi / 1000)) {
    probe.budget = lo + (hi - lo) / 2;
    probe.grid_bytes = std::max<std::int64_t>(1, probe.budget / 8192);
    PlannerResult r = solve_plan(probe);
    if (r.feasible) {
      hi = probe.budget;
      best = r;
    } else {
      lo = probe.budget;
    }
  }
  if (!best.feasible) {
    probe.budget = hi;
    probe.grid_bytes = std::max<std::int64_t>(1, hi / 8192);
    best = solve_plan(probe);
  }
  if (!best.feasible) {  // (the grid's rounding at the bound itself): the lean choices
    best.feasible = true;
    best.choice = lean;
    best.peak = predicted_peak(in, lean);
    best.time_ms = 0;
    for (std::size_t i = 0; i < lean.size(); ++i) best.time_ms += in.choices[i][lean[i]].time_ms;
    best.plan = plan_string(in.choices, lean);
  }
  return best;
}

}  // namespace remat
