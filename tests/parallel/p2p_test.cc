// Point-to-point sends and receives on the world group. Under `mpirun -np 2`
// / `-np 4` (tests/parallel/mpi_test.sh) every rank checks the bytes it
// receives; in one process (no launcher) only the one-process group's
// refusals run. The hidden [.p2p_fault] cases are run by p2p_fault_test.sh
// with REMAT_FAULT killing or stopping rank 1 while rank 0 waits.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/dtype.h"
#include "parallel/process_group.h"
#include "tests/skip.h"

using namespace remat;

namespace {

// What rank `from` sends: distinct values per rank and element, in `dtype`.
Tensor payload(int from, DType dtype, const Shape& shape, int salt = 0) {
  std::vector<float> v(std::size_t(shape_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(from * 1000 + salt * 100 + int(i % 97));
  return from_vector<float>(v, shape).to(dtype);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.sizes() == b.sizes() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("the one-process group has no peers: every send and receive is refused", "[parallel][p2p]") {
  auto g = single_process_group();
  Tensor t = zeros({4});
  CHECK_THROWS_WITH(g->send(t, 0, 0), Catch::Contains("send to rank 0 (tag 0, rank 0 of 1)") &&
                                          Catch::Contains("a group of one process has no peers to send to"));
  CHECK_THROWS_WITH(g->recv(t, 0, 3), Catch::Contains("recv from rank 0 (tag 3, rank 0 of 1)") &&
                                          Catch::Contains("no peers to receive from"));
  CHECK_THROWS_WITH(g->isend(t, 1, 0), Catch::Contains("no peers"));
  CHECK_THROWS_WITH(g->irecv(t, 1, 0), Catch::Contains("no peers"));
  CHECK(g->counters().calls_in(CommPhase::forward) == 0);
}

TEST_CASE("a ring: each rank sends to the next and receives from the previous (f32, bf16, i64, empty)",
          "[parallel][p2p]") {
  auto g = world_group();
  const int r = g->rank(), n = g->size();
  if (n < 2) REMAT_SKIP("needs 2 or more ranks: mpi_test.sh runs it under mpirun");
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (DType dt : {DType::f32, DType::bf16, DType::i64}) {
    for (const Shape& shape : {Shape{3, 5, 7}, Shape{0, 4}, Shape{1}}) {
      INFO(dtype_name(dt) << " " << shape_str(shape));
      Tensor out = payload(r, dt, shape);
      Tensor in = zeros(shape, dt);
      const auto v0 = in.version();
      auto rw = g->irecv(in, prev, 11);
      auto sw = g->isend(out, next, 11);
      sw->wait();
      rw->wait();
      rw->wait();  // again: nothing more happens
      CHECK(same_bytes(in, payload(prev, dt, shape)));
      CHECK(in.version() > v0);  // written in place
    }
  }
  // The blocking forms, around the ring in order (rank 0 sends first, the
  // others receive first), in both directions.
  for (int dir : {1, -1}) {
    const int to = (r + dir + n) % n, from = (r - dir + n) % n;
    Tensor out = payload(r, DType::f32, {64});
    Tensor in = zeros({64});
    if (r == 0) {
      g->send(out, to, 2);
      g->recv(in, from, 2);
    } else {
      g->recv(in, from, 2);
      g->send(out, to, 2);
    }
    CHECK(same_bytes(in, payload(from, DType::f32, {64})));
  }
}

TEST_CASE("messages with different tags are matched by tag, not by order", "[parallel][p2p]") {
  auto g = world_group();
  const int r = g->rank(), n = g->size();
  if (n < 2) REMAT_SKIP("needs 2 or more ranks: mpi_test.sh runs it under mpirun");
  // Pairs (0, 1), (2, 3), ...: the even rank sends tag 1 then tag 2, the odd
  // rank receives tag 2 first. A third message shares tag 1 with the first
  // and so follows it.
  if (r % 2 == 0 && r + 1 < n) {
    Tensor a = payload(r, DType::f32, {100}, 1), b = payload(r, DType::f32, {7}, 2), c = payload(r, DType::f32, {3}, 3);
    auto wa = g->isend(a, r + 1, 1);
    auto wb = g->isend(b, r + 1, 2);
    auto wc = g->isend(c, r + 1, 1);
    wc->wait();
    wb->wait();
    wa->wait();
  } else if (r % 2 == 1) {
    Tensor b = zeros({7}), a = zeros({100}), c = zeros({3});
    g->recv(b, r - 1, 2);
    g->recv(a, r - 1, 1);
    g->recv(c, r - 1, 1);
    CHECK(same_bytes(a, payload(r - 1, DType::f32, {100}, 1)));
    CHECK(same_bytes(b, payload(r - 1, DType::f32, {7}, 2)));
    CHECK(same_bytes(c, payload(r - 1, DType::f32, {3}, 3)));
  }
}

TEST_CASE("many sends and receives in flight at once, large and small, complete without deadlock",
          "[parallel][p2p]") {
  auto g = world_group();
  const int r = g->rank(), n = g->size();
  if (n < 2) REMAT_SKIP("needs 2 or more ranks: mpi_test.sh runs it under mpirun");
  // To and from every other rank, 6 messages each: 1 MiB ones (past MPI's
  // eager limit, so a send completes only once it is received) and small
  // ones. Receives are posted first, then sends; the sends are waited for
  // first (which needs the peers' receives to progress), then the receives
  // polled with test().
  const int k = 6;
  auto shape_of = [](int m) { return m % 2 == 0 ? Shape{256, 1024} : Shape{m + 1}; };
  std::vector<Tensor> in, out;
  std::vector<std::shared_ptr<CommWork>> recvs, sends;
  std::vector<int> from;
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    for (int m = 0; m < k; ++m) {
      in.push_back(zeros(shape_of(m)));
      from.push_back(p);
      recvs.push_back(g->irecv(in.back(), p, m));
    }
  }
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    for (int m = 0; m < k; ++m) {
      out.push_back(payload(r, DType::f32, shape_of(m), m));
      sends.push_back(g->isend(out.back(), p, m));
    }
  }
  for (auto& w : sends) w->wait();
  for (bool all = false; !all;) {
    all = true;
    for (auto& w : recvs) all = w->test() && all;
  }
  for (std::size_t i = 0; i < in.size(); ++i) {
    const int m = int(i % std::size_t(k));
    CHECK(same_bytes(in[i], payload(from[i], DType::f32, shape_of(m), m)));
  }
}

TEST_CASE("sends and receives are counted per kind and per phase", "[parallel][p2p]") {
  auto g = world_group();
  const int r = g->rank(), n = g->size();
  CHECK(std::string(collective_name(CollectiveKind::send)) == "send");
  CHECK(std::string(collective_name(CollectiveKind::recv)) == "recv");
  CHECK(kCollectiveKinds == 8);
  if (n < 2) REMAT_SKIP("needs 2 or more ranks: mpi_test.sh runs it under mpirun");
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  g->reset_counters();
  Tensor out = zeros({10}), in = zeros({10});  // 40 bytes
  auto rw = g->irecv(in, prev, 0);
  g->send(out, next, 0);
  rw->wait();
  std::shared_ptr<CommWork> late;
  {
    CommPhaseScope backward(CommPhase::backward);
    Tensor small_out = zeros({2}, DType::i64), small_in = zeros({2}, DType::i64);  // 16 bytes
    auto w = g->irecv(small_in, prev, 1);
    g->send(small_out, next, 1);
    w->wait();
    late = g->isend(out, next, 2);  // started in backward, waited for outside: counted as backward
  }
  Tensor late_in = zeros({10});
  g->recv(late_in, prev, 2);
  late->wait();
  const CommCounters c = g->counters();
  using K = CollectiveKind;
  using P = CommPhase;
  CHECK(c.calls_of(K::send, P::forward) == 1);
  CHECK(c.bytes_of(K::send, P::forward) == 40);
  CHECK(c.calls_of(K::recv, P::forward) == 2);
  CHECK(c.bytes_of(K::recv, P::forward) == 80);
  CHECK(c.calls_of(K::send, P::backward) == 2);
  CHECK(c.bytes_of(K::send, P::backward) == 16 + 40);
  CHECK(c.calls_of(K::recv, P::backward) == 1);
  CHECK(c.bytes_of(K::recv, P::backward) == 16);
  CHECK(c.calls_in(P::forward) == 3);
  CHECK(c.bytes_in(P::backward) == 16 + 40 + 16);
  CHECK(c.calls_in(P::replay) == 0);
  CHECK(c.calls_of(K::all_reduce, P::forward) == 0);
}

TEST_CASE("a message of another size is an error naming both ranks, the tag and both byte counts",
          "[parallel][p2p]") {
  auto g = world_group();
  const int r = g->rank(), n = g->size();
  if (n < 2) REMAT_SKIP("needs 2 or more ranks: mpi_test.sh runs it under mpirun");
  // Rank 0 sends 6 floats (24 bytes) with tag 4 and 2 floats (8 bytes) with
  // tag 5; rank 1 expects 4 floats (16 bytes) for both.
  if (r == 0) {
    Tensor big = payload(0, DType::f32, {6}), small = payload(0, DType::f32, {2});
    g->send(big, 1, 4);
    g->send(small, 1, 5);
  } else if (r == 1) {
    Tensor a = zeros({4});
    const std::string larger = message_of([&] { g->recv(a, 0, 4); });
    CHECK_THAT(larger, Catch::Contains("recv from rank 0 (tag 4, rank 1 of " + std::to_string(n) + ")") &&
                           Catch::Contains("the message from rank 0 has 24 bytes but rank 1 expected 16") &&
                           Catch::Contains("[4] f32"));
    Tensor b = zeros({4});
    auto w = g->irecv(b, 0, 5);
    const std::string smaller = message_of([&] { w->wait(); });
    CHECK_THAT(smaller, Catch::Contains("recv from rank 0 (tag 5, rank 1 of ") &&
                            Catch::Contains("has 8 bytes but rank 1 expected 16"));
    CHECK(message_of([&] { w->wait(); }) == smaller);  // again: the same error
    CHECK(message_of([&] { w->test(); }) == smaller);
  }
  // The pair still talks afterwards.
  g->barrier();
  if (r < 2) {
    Tensor out = payload(r, DType::f32, {5}), in = zeros({5});
    auto w = g->irecv(in, 1 - r, 6);
    g->send(out, 1 - r, 6);
    w->wait();
    CHECK(same_bytes(in, payload(1 - r, DType::f32, {5})));
  }
}

TEST_CASE("bad peers, tags and tensors are refused before anything is sent", "[parallel][p2p]") {
  auto g = world_group();
  const int r = g->rank(), n = g->size();
  if (n < 2) REMAT_SKIP("needs 2 or more ranks: mpi_test.sh runs it under mpirun");
  const std::string me = " of " + std::to_string(n) + ")";
  Tensor t = zeros({4, 3});
  g->reset_counters();
  CHECK_THROWS_WITH(g->send(t, n, 0), Catch::Contains("send to rank " + std::to_string(n) + " (tag 0, rank " +
                                                      std::to_string(r) + me) &&
                                          Catch::Contains("no such rank; the destination must be another rank") &&
                                          Catch::Contains("0 to " + std::to_string(n - 1)));
  CHECK_THROWS_WITH(g->irecv(t, -1, 0),
                    Catch::Contains("recv from rank -1") && Catch::Contains("no such rank; the source"));
  CHECK_THROWS_WITH(g->isend(t, r, 0), Catch::Contains("send to rank " + std::to_string(r)) &&
                                           Catch::Contains("a rank cannot send to itself"));
  CHECK_THROWS_WITH(g->recv(t, r, 0), Catch::Contains("a rank cannot receive from itself"));
  const int peer = (r + 1) % n;
  CHECK_THROWS_WITH(g->isend(t, peer, -2),
                    Catch::Contains("(tag -2, rank ") && Catch::Contains("the tag must be >= 0"));
  Tensor view = t.transpose(0, 1);
  CHECK_THROWS_WITH(g->isend(view, peer, 0), Catch::Contains("the tensor must be contiguous, got sizes [3, 4]"));
  CHECK_THROWS_WITH(g->irecv(view, peer, 0), Catch::Contains("recv from rank") && Catch::Contains("contiguous"));
  CHECK(g->counters().calls_in(CommPhase::forward) == 0);  // nothing counted
}

// Run by p2p_fault_test.sh under mpirun -np 2 with REMAT_FAULT on rank 1:
// rank 1's 2nd counted operation (its send with tag 7) kills or stops it
// while rank 0 waits to receive that message.
TEST_CASE("p2p fault: rank 0 waits in a recv while rank 1 fails", "[.p2p_fault]") {
  auto g = world_group();
  REQUIRE(g->size() == 2);
  Tensor t = zeros({1024});  // 4096 bytes
  if (g->rank() == 0) {
    g->send(t, 1, 5);
    g->recv(t, 1, 7);
  } else {
    g->recv(t, 0, 5);
    g->send(t, 0, 7);
  }
}

// Rank 1's 1st counted operation (its receive) kills it while rank 0 waits
// for its 4 MiB send (past the eager limit: it completes only once received).
TEST_CASE("p2p fault: rank 0 waits in a send while rank 1 fails", "[.p2p_fault_send]") {
  auto g = world_group();
  REQUIRE(g->size() == 2);
  Tensor t = zeros({1024, 1024});
  if (g->rank() == 0)
    g->send(t, 1, 9);
  else
    g->recv(t, 0, 9);
}
