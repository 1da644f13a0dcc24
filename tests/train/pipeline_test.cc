// Pipeline schedules and stage splits (train/pipeline.h): every micro-batch's
// forward precedes its backward, backwards run in micro-batch order (so
// gradients accumulate as one process would), 1F1B holds at most P - s
// micro-batches where GPipe holds M, and the balanced split is the best one.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <limits>
#include <random>

#include "engine/error.h"
#include "train/pipeline.h"

using namespace remat;

TEST_CASE("pipeline schedules: order, backward order and micro-batches in flight", "[pipeline]") {
  for (const auto sched : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b}) {
    for (std::int64_t P : {1, 2, 3, 4, 8}) {
      for (std::int64_t M : {1, 2, 3, 4, 8, 16}) {
        for (std::int64_t s = 0; s < P; ++s) {
          INFO(pipeline_schedule_name(sched) << " P " << P << " M " << M << " stage " << s);
          const auto ops = pipeline_ops(sched, P, s, M);
          REQUIRE(std::int64_t(ops.size()) == 2 * M);
          std::vector<std::int64_t> forwards, backwards;
          std::vector<bool> done(std::size_t(M), false);
          for (const PipelineOp& op : ops) {
            if (op.forward) {
              forwards.push_back(op.micro);
              done[std::size_t(op.micro)] = true;
            } else {
              CHECK(done[std::size_t(op.micro)]);  // its forward ran before
              backwards.push_back(op.micro);
            }
          }
          for (std::int64_t m = 0; m < M; ++m) {
            CHECK(forwards[std::size_t(m)] == m);
            CHECK(backwards[std::size_t(m)] == m);  // accumulation in micro-batch order
          }
          const std::int64_t want = sched == PipelineSchedule::gpipe ? M : std::min(M, P - s);
          CHECK(max_in_flight(ops) == want);
        }
      }
    }
  }
  // The 1F1B shape on stage 1 of 4 with 6 micro-batches: 2 warm-up
  // forwards, then F/B pairs, then the cool-down.
  const auto ops = pipeline_ops(PipelineSchedule::one_f_one_b, 4, 1, 6);
  const std::vector<PipelineOp> want = {{true, 0},  {true, 1},  {true, 2},  {false, 0}, {true, 3}, {false, 1},
                                        {true, 4},  {false, 2}, {true, 5},  {false, 3}, {false, 4}, {false, 5}};
  CHECK(ops == want);
  CHECK(parse_pipeline_schedule("1f1b") == PipelineSchedule::one_f_one_b);
  CHECK_THROWS_WITH(parse_pipeline_schedule("zb"), Catch::Contains("--pp-schedule 'zb': expected gpipe"));
  CHECK_THROWS_AS(pipeline_ops(PipelineSchedule::gpipe, 2, 2, 4), Error);
}

// Runs every stage's schedule together with the executor's rules (a forward
// of stage s > 0 waits for stage s - 1's forward of that micro-batch, a
// backward of stage s < P - 1 for stage s + 1's backward; sends never wait):
// every stage must finish.
TEST_CASE("pipeline schedules complete together: no stage waits forever", "[pipeline]") {
  for (const auto sched : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b}) {
    for (std::int64_t P = 1; P <= 8; ++P) {
      for (std::int64_t M = 1; M <= 16; ++M) {
        INFO(pipeline_schedule_name(sched) << " P " << P << " M " << M);
        std::vector<std::vector<PipelineOp>> ops;
        for (std::int64_t s = 0; s < P; ++s) ops.push_back(pipeline_ops(sched, P, s, M));
        std::vector<std::size_t> next(static_cast<std::size_t>(P), 0);
        const std::vector<bool> none(static_cast<std::size_t>(M), false);
        std::vector<std::vector<bool>> fwd(static_cast<std::size_t>(P), none), bwd = fwd;
        bool progress = true;
        while (progress) {
          progress = false;
          for (std::int64_t s = 0; s < P; ++s) {
            while (next[std::size_t(s)] < ops[std::size_t(s)].size()) {
              const PipelineOp& op = ops[std::size_t(s)][next[std::size_t(s)]];
              const bool ready = op.forward ? (s == 0 || fwd[std::size_t(s - 1)][std::size_t(op.micro)])
                                            : (s == P - 1 || bwd[std::size_t(s + 1)][std::size_t(op.micro)]);
              if (!ready) break;
              (op.forward ? fwd : bwd)[std::size_t(s)][std::size_t(op.micro)] = true;
              ++next[std::size_t(s)];
              progress = true;
            }
          }
        }
        for (std::int64_t s = 0; s < P; ++s) CHECK(next[std::size_t(s)] == ops[std::size_t(s)].size());
      }
    }
  }
}

TEST_CASE("pipeline stages: the balanced split minimises the largest stage", "[pipeline]") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const std::int64_t n = 1 + std::int64_t(rng() % 9), P = 1 + std::int64_t(rng() % std::uint64_t(n));
    std::vector<std::int64_t> w(static_cast<std::size_t>(n));
    for (auto& x : w) x = 1 + std::int64_t(rng() % 100);
    const std::int64_t first = std::int64_t(rng() % 150), last = std::int64_t(rng() % 150);
    INFO("trial " << trial << " blocks " << n << " stages " << P);
    const auto bounds = balanced_stages(w, first, last, P);
    REQUIRE(std::int64_t(bounds.size()) == P + 1);
    auto largest = [&](const std::vector<std::int64_t>& b) {
      std::int64_t most = 0;
      for (std::int64_t s = 0; s < P; ++s) {
        std::int64_t c = (s == 0 ? first : 0) + (s == P - 1 ? last : 0);
        for (std::int64_t i = b[std::size_t(s)]; i < b[std::size_t(s + 1)]; ++i) c += w[std::size_t(i)];
        most = std::max(most, c);
      }
      return most;
    };
    for (std::int64_t s = 0; s < P; ++s) CHECK(bounds[std::size_t(s)] < bounds[std::size_t(s + 1)]);
    // Brute force over every split into P non-empty runs.
    std::int64_t best = std::numeric_limits<std::int64_t>::max();
    std::vector<std::int64_t> b(std::size_t(P + 1));
    b[0] = 0;
    b[std::size_t(P)] = n;
    std::function<void(std::int64_t)> go = [&](std::int64_t s) {
      if (s == P) {
        best = std::min(best, largest(b));
        return;
      }
      for (std::int64_t at = b[std::size_t(s - 1)] + 1; at <= n - (P - s); ++at) {
        b[std::size_t(s)] = at;
        go(s + 1);
      }
    };
    if (P == 1) best = largest(b);
    else go(1);
    CHECK(largest(bounds) == best);
  }
  CHECK(balanced_stages({10, 10, 10, 10}, 0, 0, 2) == std::vector<std::int64_t>{0, 2, 4});
  CHECK(balanced_stages({10, 10, 10, 10}, 25, 0, 2) == std::vector<std::int64_t>{0, 1, 4});  // the embedding weighs
  CHECK_THROWS_WITH(balanced_stages({1, 2}, 0, 0, 3), Catch::Contains("--pp 3: the model has 2 blocks"));
  CHECK(parse_pp_split("3,6", 8, 3) == std::vector<std::int64_t>{0, 3, 6, 8});
  CHECK_THROWS_WITH(parse_pp_split("6,3", 8, 3), Catch::Contains("boundary 3 is out of order or range"));
  CHECK_THROWS_WITH(parse_pp_split("3", 8, 3), Catch::Contains("1 boundaries given"));
  CHECK_THROWS_WITH(parse_pp_split("3,x", 8, 3), Catch::Contains("'x' is not a number"));
  CHECK_THROWS_WITH(parse_pp_split("0,3", 8, 3), Catch::Contains("out of order or range"));
  CHECK_THROWS_WITH(parse_pp_split("3,", 8, 2), Catch::Contains("a trailing comma"));
}
