// Collectives on the world group. Runs in one process (trivial group) and
// under `mpirun -np 2` / `-np 4` (tests/parallel/mpi_test.sh): every rank
// checks the values it receives.
#include <catch2/catch.hpp>

#include "engine/autograd.h"
#include "ops/ops.h"
#include "parallel/comm_ops.h"
#include "parallel/process_group.h"

using namespace remat;

namespace {
std::vector<float> v(const Tensor& t) { return t.to_vector<float>(); }
}  // namespace

TEST_CASE("all_reduce sums, averages and takes the max over ranks", "[parallel]") {
  auto g = world_group();
  const int r = g->rank(), n = g->size();
  Tensor t = from_vector<float>({float(r + 1), float(10 * r)});
  g->all_reduce(t, ReduceOp::sum);
  CHECK(v(t) == std::vector<float>{float(n * (n + 1) / 2), float(10 * n * (n - 1) / 2)});
  Tensor a = from_vector<float>({float(r)});
  g->all_reduce(a, ReduceOp::avg);
  CHECK(a.item() == Approx((n - 1) / 2.0));
  Tensor m = from_vector<std::int64_t>({std::int64_t(r * 7)});
  g->all_reduce(m, ReduceOp::max);
  CHECK(m.item() == double(7 * (n - 1)));
}

TEST_CASE("all_gather and reduce_scatter", "[parallel]") {
  auto g = world_group();
  const int r = g->rank(), n = g->size();
  Tensor t = full({2, 3}, double(r));
  Tensor all = g->all_gather(t);
  REQUIRE(all.sizes() == Shape{2 * n, 3});
  for (int k = 0; k < n; ++k) CHECK(all.at({2 * k + 1, 2}) == double(k));
  // Every rank contributes arange(n * 2); rank r gets rows [2r, 2r + 2) summed.
  Tensor x = arange(0.0, double(2 * n), 1.0).view({2 * n, 1});
  Tensor mine = g->reduce_scatter(x, ReduceOp::sum);
  CHECK(v(mine) == std::vector<float>{float(n * 2 * r), float(n * (2 * r + 1))});
  if (n > 1)
    CHECK_THROWS_WITH(g->reduce_scatter(zeros({2 * n + 1, 1}), ReduceOp::sum), Catch::Contains("must divide"));
  // Started without waiting, into a buffer the caller owns.
  Tensor out = full({2 * n, 3}, -1.0);
  auto work = g->all_gather_async(t, out);
  work->test();
  work->wait();
  CHECK(v(out) == v(all));
  Tensor wrong = zeros({2 * n + 1, 3});
  CHECK_THROWS_WITH(g->all_gather_async(t, wrong), Catch::Contains("all_gather_async: the output must be"));
}

TEST_CASE("all_to_all moves rows with per-rank split sizes, and can reuse known counts", "[parallel]") {
  auto g = world_group();
  const int r = g->rank(), n = g->size();
  // Rank r sends (k + 1) rows to rank k, each row [r, k].
  std::vector<std::int64_t> send(static_cast<std::size_t>(n));
  std::vector<float> rows;
  for (int k = 0; k < n; ++k) {
    send[std::size_t(k)] = k + 1;
    for (int j = 0; j <= k; ++j) {
      rows.push_back(float(r));
      rows.push_back(float(k));
    }
  }
  Tensor t = from_vector<float>(rows, {std::int64_t(rows.size() / 2), 2});
  std::vector<std::int64_t> recv;
  g->reset_counters();
  Tensor got = g->all_to_all(t, send, recv);
  // From every rank s this rank receives r + 1 rows [s, r].
  CHECK(recv == std::vector<std::int64_t>(std::size_t(n), r + 1));
  REQUIRE(got.size(0) == std::int64_t(n) * (r + 1));
  for (int s = 0; s < n; ++s) {
    CHECK(got.at({std::int64_t(s) * (r + 1), 0}) == double(s));
    CHECK(got.at({std::int64_t(s) * (r + 1), 1}) == double(r));
  }
  // Reusing the known receive counts skips the count exchange.
  const auto c1 = g->counters();
  std::vector<std::int64_t> recv2;
  Tensor again = g->all_to_all(t, send, recv2, &recv);
  const auto c2 = g->counters();
  CHECK(v(again) == v(got));
  CHECK(c2.calls_in(CommPhase::forward) - c1.calls_in(CommPhase::forward) == 1);
  if (n > 1) CHECK(c1.calls_in(CommPhase::forward) == 2);  // counts + rows
}

TEST_CASE("broadcast, barrier, sub-groups and phase counters", "[parallel]") {
  auto g = world_group();
  const int r = g->rank(), n = g->size();
  Tensor t = full({3}, double(r + 5));
  g->broadcast(t, 0);
  CHECK(v(t) == std::vector<float>(3, 5.0f));
  g->barrier();
  // Even and odd ranks form two groups.
  auto sub = g->split(r % 2, r);
  CHECK(sub->size() == (n + 1 - r % 2) / 2);
  Tensor s = from_vector<float>({1.0f});
  sub->all_reduce(s, ReduceOp::sum);
  CHECK(s.item() == double(sub->size()));
  // Collectives inside a backward count as backward traffic.
  g->reset_counters();
  Tensor x = from_vector<float>({1.0f, 2.0f});
  x.set_requires_grad(true);
  Tensor y = x.clone();
  y.register_hook([&](const Tensor& grad) {
    Tensor gr = grad.clone();
    g->all_reduce(gr, ReduceOp::sum);
    return gr;
  });
  y.backward(from_vector<float>({1.0f, 1.0f}));
  CHECK(g->counters().calls_in(CommPhase::backward) == 1);
  CHECK(g->counters().calls_in(CommPhase::forward) == 0);
  CHECK(v(x.grad()) == std::vector<float>(2, float(n)));
}

TEST_CASE("collectives as autograd ops send gradients back the way data came", "[parallel][autograd]") {
  auto g = world_group();
  const int r = g->rank(), n = g->size();
  // all_to_all: rank r sends one row [r * 10 + k] to each rank k.
  std::vector<float> rows;
  for (int k = 0; k < n; ++k) rows.push_back(float(r * 10 + k));
  Tensor x = from_vector<float>(rows, {n, 1});
  x.set_requires_grad(true);
  std::vector<std::int64_t> recv;
  Tensor y = all_to_all(g, x, std::vector<std::int64_t>(std::size_t(n), 1), recv);
  for (int s = 0; s < n; ++s) CHECK(y.at({s, 0}) == double(s * 10 + r));
  // Weight each received row by (its sender + 1): the gradient that comes back
  // to row k of rank r is (r + 1), since rank k received it from r.
  std::vector<float> w;
  for (int s = 0; s < n; ++s) w.push_back(float(s + 1));
  g->reset_counters();
  sum(mul(y, from_vector<float>(w, {n, 1}))).backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>(std::size_t(n), float(r + 1)));
  CHECK(g->counters().calls_in(CommPhase::backward) == 1);  // known counts: no exchange
  // all_gather <-> reduce_scatter.
  Tensor a = full({1, 2}, double(r));
  a.set_requires_grad(true);
  Tensor gathered = all_gather(g, a);
  CHECK(gathered.size(0) == n);
  sum(gathered).backward();
  CHECK(a.grad().to_vector<float>() == std::vector<float>(2, float(n)));
  Tensor b = ones({std::int64_t(n), 1});
  b.set_requires_grad(true);
  Tensor part = reduce_scatter(g, b);
  CHECK(part.item() == double(n));
  sum(part).backward();
  CHECK(b.grad().to_vector<float>() == std::vector<float>(std::size_t(n), 1.0f));
}

TEST_CASE("all_to_all moves rows to and from ranks that have none", "[parallel]") {
  auto g = world_group();
  const int r = g->rank(), n = g->size();
  // Rank 0 holds no rows; every other rank sends 2 rows of width 3 to rank 0.
  const std::int64_t mine = r == 0 ? 0 : 2;
  std::vector<std::int64_t> send(std::size_t(n), 0);
  if (n > 1) send[0] = mine;
  else send[0] = 0;
  Tensor t = full({mine, 3}, double(r));
  std::vector<std::int64_t> recv;
  Tensor got = g->all_to_all(t, send, recv);
  const std::int64_t expect = r == 0 ? 2 * (n - 1) : 0;
  REQUIRE(got.sizes() == Shape{expect, 3});
  if (r == 0)
    for (int k = 1; k < n; ++k) CHECK(got.at({2 * (k - 1) + 1, 2}) == double(k));
  // And back, with known counts: rank 0 now sends, the others receive.
  std::vector<std::int64_t> back;
  Tensor home = g->all_to_all(got, recv, back, &send);
  CHECK(home.sizes() == t.sizes());
}
