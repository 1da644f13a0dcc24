// The bench's execution order: every variant once per round, balanced over
// slots and over which variant runs just before which.
#include "tools/bench_order.h"

#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "engine/error.h"

using remat::tools::bench_order;

namespace {

std::vector<std::int64_t> variants(const std::vector<remat::tools::BenchSlot>& order) {
  std::vector<std::int64_t> v;
  for (const auto& s : order) v.push_back(s.variant);
  return v;
}

}  // namespace

TEST_CASE("two variants run ABBA", "[bench]") {
  CHECK(variants(bench_order(2, 4)) == std::vector<std::int64_t>{0, 1, 1, 0, 0, 1, 1, 0});
  CHECK(variants(bench_order(1, 3)) == std::vector<std::int64_t>{0, 0, 0});
}

TEST_CASE("three variants: rotations, then their reverses", "[bench]") {
  CHECK(variants(bench_order(3, 6)) ==
        std::vector<std::int64_t>{0, 1, 2, 1, 2, 0, 2, 0, 1, 2, 1, 0, 0, 2, 1, 1, 0, 2});
}

TEST_CASE("a complete design balances slots and predecessors", "[bench]") {
  for (std::int64_t n = 1; n <= 7; ++n) {
    const std::int64_t rows = n % 2 == 0 ? n : 2 * n;
    const auto order = bench_order(n, rows);
    REQUIRE(std::int64_t(order.size()) == n * rows);
    std::map<std::pair<std::int64_t, std::int64_t>, int> at_slot, follows;
    std::map<std::int64_t, std::set<std::int64_t>> repeats_of;
    for (std::size_t i = 0; i < order.size(); ++i) {
      const auto& s = order[i];
      CHECK(s.position == std::int64_t(i));
      CHECK(s.slot == std::int64_t(i) % n);
      CHECK(s.repeat == std::int64_t(i) / n);
      repeats_of[s.variant].insert(s.repeat);
      ++at_slot[{s.variant, s.slot}];
      if (s.slot > 0) ++follows[{order[i - 1].variant, s.variant}];
    }
    for (std::int64_t v = 0; v < n; ++v) {
      CHECK(std::int64_t(repeats_of[v].size()) == rows);  // once per round
      for (std::int64_t j = 0; j < n; ++j) CHECK(at_slot[{v, j}] == rows / n);
    }
    // Within rounds, each ordered pair of distinct variants is adjacent equally often.
    std::set<int> counts;
    for (const auto& [pair, c] : follows) {
      CHECK(pair.first != pair.second);
      counts.insert(c);
    }
    if (n > 1) {
      CHECK(follows.size() == std::size_t(n * (n - 1)));
      CHECK(counts.size() == 1);
    }
  }
}

TEST_CASE("bench_order refuses empty designs", "[bench]") {
  CHECK_THROWS_AS(bench_order(0, 3), remat::Error);
  CHECK_THROWS_AS(bench_order(2, 0), remat::Error);
}
