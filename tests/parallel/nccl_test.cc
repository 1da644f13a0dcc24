// The NCCL back end on CUDA tensors, against the values the MPI / one-process
// groups give on the CPU. Tagged [cuda]: without a GPU the test main skips
// them and says so. One process here (one GPU); under mpirun with one GPU per
// rank the same cases run over the job.
#include <catch2/catch.hpp>

#include "engine/device_runtime.h"
#include "parallel/nccl_group.h"
#include "parallel/process_group.h"

using namespace remat;

TEST_CASE("without CUDA, or without a device, an NCCL group is refused clearly", "[parallel]") {
  auto world = world_group();
  if (!nccl_available()) {
    CHECK_THROWS_WITH(nccl_group(world, 0), Catch::Contains("no CUDA"));
  } else if (cuda_device_count() == 0) {
    CHECK_THROWS_WITH(nccl_group(world, 0), Catch::Contains("NCCL group: cudaSetDevice"));
  } else {
    SUCCEED("a device is present: the [cuda] case below checks the group");
  }
}

TEST_CASE("NCCL collectives on CUDA tensors match the CPU results", "[cuda]") {
  auto world = world_group();
  const int r = world->rank(), n = world->size();
  auto g = nccl_group(world, r);
  const Device dev = cuda_device(r);
  Tensor t = full({4, 3}, double(r + 1)).to(dev);
  g->all_reduce(t, ReduceOp::sum);
  CHECK(t.to(kCPU).at({3, 2}) == double(n * (n + 1) / 2));
  Tensor all = g->all_gather(full({2, 3}, double(r)).to(dev)).to(kCPU);
  REQUIRE(all.sizes() == Shape{2 * n, 3});
  for (int k = 0; k < n; ++k) CHECK(all.at({2 * k + 1, 1}) == double(k));
  Tensor rs = g->reduce_scatter(arange(0.0, double(2 * n), 1.0).view({2 * n, 1}).to(dev), ReduceOp::sum).to(kCPU);
  CHECK(rs.at({1, 0}) == double(n * (2 * r + 1)));
  // all_to_all: rank r sends k + 1 rows of value 10 r + k to rank k.
  std::vector<std::int64_t> send;
  std::vector<float> rows;
  for (int k = 0; k < n; ++k) {
    send.push_back(k + 1);
    for (int i = 0; i <= k; ++i) rows.insert(rows.end(), {float(10 * r + k), float(10 * r + k)});
  }
  Tensor x = from_vector<float>(rows, {std::int64_t(rows.size() / 2), 2}).to(dev);
  std::vector<std::int64_t> recv;
  Tensor y = g->all_to_all(x, send, recv).to(kCPU);
  REQUIRE(y.size(0) == std::int64_t(n) * (r + 1));
  for (int k = 0; k < n; ++k) CHECK(y.at({std::int64_t(k) * (r + 1), 0}) == double(10 * k + r));
  Tensor b = full({3}, double(r + 5)).to(dev);
  g->broadcast(b, 0);
  CHECK(b.to(kCPU).at({2}) == 5.0);
  CHECK(g->counters().calls_in(CommPhase::forward) >= 5);
}
