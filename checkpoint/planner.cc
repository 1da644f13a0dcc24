#include "checkpoint/planner.h"

#include <algorithm>
#include <limits>

#include "engine/error.h"

namespace remat {

std::int64_t predicted_peak(const PlannerInput& in, const std::vector<std::size_t>& choice) {
  std::int64_t prefix = 0, peak = 0;
  for (std::size_t i = 0; i < in.choices.size(); ++i) {
    const PlanChoice& c = in.choices[i].at(choice.at(i));
    peak = std::max(peak, in.backward_base + prefix + c.held + c.work);
    prefix += c.held;
  }
  return std::max(peak, in.forward_base + prefix);
}

std::string plan_string(const std::vector<std::vector<PlanChoice>>& choices, const std::vector<std::size_t>& choice) {
  const std::int64_t n = std::int64_t(choices.size());
  std::string out;
  for (std::int64_t b = 0; b < n;) {
    const std::string& comp = choices[std::size_t(b)].at(choice[std::size_t(b)]).component;
    std::int64_t e = b;
    while (e + 1 < n && choices[std::size_t(e + 1)].at(choice[std::size_t(e + 1)]).component == comp) ++e;
    if (!comp.empty()) {
      // A component of several parts ("per_block+offload") gets the range on each.
      std::string ranged;
      std::size_t start = 0;
      while (start <= comp.size()) {
        const std::size_t plus = comp.find('+', start);
        const std::string part = comp.substr(start, plus == std::string::npos ? std::string::npos : plus - start);
        ranged += (ranged.empty() ? "" : "+") + part +
                  (b == 0 && e == n - 1 ? "" : "@" + std::to_string(b) + (e == b ? "" : "-" + std::to_string(e)));
        if (plus == std::string::npos) break;
        start = plus + 1;
      }
      out += (out.empty() ? "" : "+") + ranged;
    }
    b = e + 1;
  }
  return out.empty() ? "none" : out;
}

namespace {

bool allowed(const PlannerInput& in, const PlanChoice& c) { return in.allow_lossy || !c.lossy; }

void check_input(const PlannerInput& in) {
  REMAT_CHECK(!in.choices.empty(), Error, "planner: no blocks to plan");
  for (std::size_t i = 0; i < in.choices.size(); ++i) {
    bool any = false;
    for (const auto& c : in.choices[i]) any = any || allowed(in, c);
    REMAT_CHECK(any, Error, "planner: block ", i, " has no choice", in.allow_lossy ? "" : " that is lossless");
  }
}

}  // namespace

PlannerResult solve_plan(const PlannerInput& in) {
  check_input(in);
  PlannerResult res;
  const std::int64_t base = std::min(in.forward_base, in.backward_base);
  if (in.budget < base) return res;
  const std::int64_t grid = in.grid_bytes > 0 ? in.grid_bytes : std::max<std::int64_t>(1, in.budget / 4096);
  const std::int64_t units = (in.budget - base) / grid;  // the prefix sum never exceeds this
  const std::size_t L = in.choices.size(), U = std::size_t(units) + 1;
  const double inf = std::numeric_limits<double>::infinity();
  auto up = [grid](std::int64_t bytes) { return (bytes + grid - 1) / grid; };
  // dp[S]: least time of blocks 0..i-1 whose held bytes, rounded up to the
  // grid block by block, sum to S units; from[i][S]: (S before block i, choice).
  std::vector<double> dp(U, inf), next(U);
  dp[0] = 0;
  std::vector<std::vector<std::pair<std::int32_t, std::int32_t>>> from(L, std::vector<std::pair<std::int32_t, std::int32_t>>(U, {-1, -1}));
  for (std::size_t i = 0; i < L; ++i) {
    std::fill(next.begin(), next.end(), inf);
    for (std::size_t S = 0; S < U; ++S) {
      if (dp[S] == inf) continue;
      for (std::size_t k = 0; k < in.choices[i].size(); ++k) {
        const PlanChoice& c = in.choices[i][k];
        if (!allowed(in, c)) continue;
        // Block i's backward: everything before it, what it holds, what it needs.
        if (in.backward_base + std::int64_t(S) * grid + c.held + c.work > in.budget) continue;
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
  // The forward-end peak, then the least time.
  std::int64_t best = -1;
  for (std::size_t S = 0; S < U; ++S)
    if (dp[S] < inf && in.forward_base + std::int64_t(S) * grid <= in.budget && (best < 0 || dp[S] < dp[std::size_t(best)]))
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

PlannerResult smallest_peak_plan(const PlannerInput& in) {
  check_input(in);
  // An upper bound: every block's smallest-footprint allowed choice.
  std::vector<std::size_t> lean(in.choices.size(), 0);
  for (std::size_t i = 0; i < in.choices.size(); ++i) {
    std::int64_t bestv = -1;
    for (std::size_t k = 0; k < in.choices[i].size(); ++k) {
      const auto& c = in.choices[i][k];
      if (!allowed(in, c)) continue;
      if (bestv < 0 || c.held + c.work < bestv) {
        bestv = c.held + c.work;
        lean[i] = k;
      }
    }
  }
  std::int64_t hi = predicted_peak(in, lean), lo = std::min(in.forward_base, in.backward_base);
  PlannerInput probe = in;
  PlannerResult best;
  // The least feasible budget, to 1/1000 of it (the grid is finer than that).
  while (hi - lo > std::max<std::int64_t>(1, hi / 1000)) {
    probe.budget = lo + (hi - lo) / 2;
    probe.grid_bytes = std::max<std::int64_t>(1, probe.budget / 65536);
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
    probe.grid_bytes = std::max<std::int64_t>(1, hi / 65536);
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
