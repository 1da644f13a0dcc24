#include <catch2/catch.hpp>

#include <sstream>

#include "engine/tensor.h"

using namespace remat;

namespace {
std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }
}  // namespace

TEST_CASE("factories fill the right values", "[tensor]") {
  Tensor z = zeros({2, 3});
  CHECK(z.sizes() == Shape{2, 3});
  CHECK(z.strides() == Shape{3, 1});
  CHECK(z.dtype() == DType::f32);
  CHECK(z.device() == kCPU);
  CHECK(values(z) == std::vector<float>(6, 0.0f));
  CHECK(values(ones({4})) == std::vector<float>(4, 1.0f));
  CHECK(values(full({2}, 2.5)) == std::vector<float>{2.5f, 2.5f});
  Tensor a = arange(5);
  CHECK(a.dtype() == DType::i64);
  CHECK(a.to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 2, 3, 4});
  CHECK(values(arange(0.0, 1.0, 0.25)) == std::vector<float>{0.0f, 0.25f, 0.5f, 0.75f});
  Tensor v = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(v.at({1, 2}) == 6.0);
  CHECK(v.at({-1, 0}) == 4.0);
  CHECK(from_vector<float>({7}).dim() == 0);
  CHECK(from_vector<float>({7}).item() == 7.0);
  CHECK_THROWS_AS(from_vector<float>({1, 2, 3}, {2, 2}), ShapeError);
}

TEST_CASE("views share storage and have the right strides", "[tensor]") {
  Tensor x = arange(0.0, 24.0, 1.0).view({2, 3, 4});
  CHECK(x.strides() == Shape{12, 4, 1});

  Tensor tr = x.transpose(0, 2);
  CHECK(tr.sizes() == Shape{4, 3, 2});
  CHECK(tr.strides() == Shape{1, 4, 12});
  CHECK(tr.shares_storage_with(x));
  CHECK(!tr.is_contiguous());
  CHECK(tr.at({3, 1, 1}) == x.at({1, 1, 3}));

  Tensor p = x.permute({1, 2, 0});
  CHECK(p.sizes() == Shape{3, 4, 2});
  CHECK(p.strides() == Shape{4, 1, 12});
  CHECK(p.at({2, 1, 1}) == x.at({1, 2, 1}));

  Tensor n = x.narrow(2, 1, 2);
  CHECK(n.sizes() == Shape{2, 3, 2});
  CHECK(n.storage_offset() == 1);
  CHECK(n.at({0, 0, 0}) == 1.0);

  Tensor s = x.slice(2, 0, 4, 2);
  CHECK(s.sizes() == Shape{2, 3, 2});
  CHECK(s.strides() == Shape{12, 4, 2});
  CHECK(values(s.select(0, 0).select(0, 1)) == std::vector<float>{4, 6});

  Tensor sel = x.select(1, 2);
  CHECK(sel.sizes() == Shape{2, 4});
  CHECK(sel.storage_offset() == 8);

  Tensor col = from_vector<float>({1, 2, 3}, {3, 1});
  Tensor e = col.expand({2, 3, 4});
  CHECK(e.sizes() == Shape{2, 3, 4});
  CHECK(e.strides() == Shape{0, 1, 0});
  CHECK(e.at({1, 2, 3}) == 3.0);
  CHECK(col.expand({3, 2}).strides() == Shape{1, 0});
  CHECK_THROWS_AS(col.expand({2, 2}), ShapeError);

  Tensor u = x.unsqueeze(1);
  CHECK(u.sizes() == Shape{2, 1, 3, 4});
  CHECK(u.squeeze(1).sizes() == Shape{2, 3, 4});
  CHECK(x.unsqueeze(-1).sizes() == Shape{2, 3, 4, 1});
  CHECK(ones({1, 3, 1}).squeeze().sizes() == Shape{3});

  CHECK(x.view({6, -1}).sizes() == Shape{6, 4});
  CHECK(x.flatten(1).sizes() == Shape{2, 12});

  // Writing through a view is visible in the base, and bumps the shared version.
  const auto v0 = x.version();
  tr.set({0, 0, 1}, 100.0);
  CHECK(x.at({1, 0, 0}) == 100.0);
  CHECK(x.version() == v0 + 1);
  CHECK(tr.version() == x.version());
}

TEST_CASE("view refuses what strides cannot express; reshape copies", "[tensor]") {
  Tensor x = arange(0.0, 6.0, 1.0).view({2, 3});
  Tensor t = x.t();
  CHECK_THROWS_AS(t.view({6}), ShapeError);
  CHECK_THROWS_WITH(t.view({6}), Catch::Contains("cannot be viewed as [6]"));
  Tensor r = t.reshape({6});
  CHECK(!r.shares_storage_with(x));
  CHECK(values(r) == std::vector<float>{0, 3, 1, 4, 2, 5});
  // A transposed view can still split/merge compatible dims without a copy.
  Tensor y = arange(0.0, 24.0, 1.0).view({2, 3, 4}).transpose(0, 1);  // [3, 2, 4]
  Tensor yv = y.view({3, 2, 2, 2});
  CHECK(yv.shares_storage_with(y));
  CHECK(yv.at({2, 1, 1, 0}) == y.at({2, 1, 2}));
  CHECK_THROWS_WITH(x.view({4, -1}), Catch::Contains("cannot view [2, 3]"));
}

TEST_CASE("contiguous and clone copy in row-major order", "[tensor]") {
  Tensor x = arange(0.0, 6.0, 1.0).view({2, 3});
  CHECK(x.contiguous().is_same(x));
  Tensor c = x.t().contiguous();
  CHECK(c.is_contiguous());
  CHECK(!c.shares_storage_with(x));
  CHECK(values(c) == std::vector<float>{0, 3, 1, 4, 2, 5});
  Tensor cl = x.clone();
  cl.set({0, 0}, 42);
  CHECK(x.at({0, 0}) == 0.0);
}

TEST_CASE("casts between dtypes", "[tensor]") {
  Tensor x = from_vector<float>({1.0f, -2.5f, 3.0f, 1e-3f});
  CHECK(values(x.to(DType::bf16)) == std::vector<float>{1.0f, -2.5f, 3.0f, float(bf16(1e-3f))});
  CHECK(values(x.to(DType::f16)) == std::vector<float>{1.0f, -2.5f, 3.0f, float(f16(1e-3f))});
  CHECK(x.to(DType::i64).to_vector<std::int64_t>() == std::vector<std::int64_t>{1, -2, 3, 0});
  CHECK(x.to(DType::boolean).to_vector<bool>() == std::vector<bool>{true, true, true, true});
  CHECK(x.to(DType::f32).is_same(x));
}

TEST_CASE("copy_ broadcasts and converts; fill_ and zero_ write views", "[tensor]") {
  Tensor dst = zeros({2, 3});
  dst.copy_(from_vector<float>({1, 2, 3}));
  CHECK(values(dst) == std::vector<float>{1, 2, 3, 1, 2, 3});
  Tensor col = dst.narrow(1, 1, 1);
  col.fill_(9.0);
  CHECK(values(dst) == std::vector<float>{1, 9, 3, 1, 9, 3});
  dst.t().narrow(0, 0, 1).zero_();
  CHECK(values(dst) == std::vector<float>{0, 9, 3, 0, 9, 3});
  // Copy from an overlapping view of itself.
  Tensor sq = arange(0.0, 4.0, 1.0).view({2, 2});
  sq.copy_(sq.t());
  CHECK(values(sq) == std::vector<float>{0, 2, 1, 3});
  Tensor i = zeros({3}, DType::i32);
  i.copy_(from_vector<float>({1.9f, -1.9f, 7.0f}));
  CHECK(i.to_vector<std::int32_t>() == std::vector<std::int32_t>{1, -1, 7});
}

TEST_CASE("version counter counts in-place writes", "[tensor]") {
  Tensor x = zeros({4});
  const auto v = x.version();
  x.fill_(1.0);
  x.zero_();
  x.copy_(ones({4}));
  x.set({0}, 3.0);
  CHECK(x.version() == v + 4);
  Tensor view = x.narrow(0, 1, 2);
  view.fill_(2.0);
  CHECK(x.version() == v + 5);
  Tensor other = x.clone();
  CHECK(other.version() == 0);  // clones start fresh
}

TEST_CASE("printing shows values, shape, dtype and device", "[tensor]") {
  std::ostringstream os;
  os << from_vector<float>({1, 2, 3, 4}, {2, 2});
  CHECK(os.str() == "tensor([[1, 2],\n        [3, 4]], shape=[2, 2], dtype=f32, device=cpu)");
  std::ostringstream big;
  big << arange(2000);
  CHECK(big.str().find("0, 1, 2, ..., 1997, 1998, 1999") != std::string::npos);
  std::ostringstream b;
  b << from_vector<bool>({true, false});
  CHECK(b.str() == "tensor([true, false], shape=[2], dtype=bool, device=cpu)");
  std::ostringstream u;
  u << Tensor();
  CHECK(u.str() == "tensor(undefined)");
}

TEST_CASE("bad shapes and indices name the op", "[tensor]") {
  Tensor x = zeros({2, 3});
  CHECK_THROWS_WITH(x.narrow(1, 2, 2), Catch::Contains("narrow: range [2, 4) is outside dim 1"));
  CHECK_THROWS_WITH(x.narrow(1, 1, INT64_MAX), Catch::Contains("narrow: range [1, beyond 2^63) is outside dim 1"));
  CHECK_THROWS_WITH(zeros({std::int64_t(1) << 62, 4}), Catch::Contains("has more elements than 64-bit byte counts"));
  CHECK_THROWS_WITH(x.transpose(0, 2), Catch::Contains("transpose: dim 2 is out of range"));
  CHECK_THROWS_WITH(x.permute({0, 0}), Catch::Contains("permute: dim 0 repeated"));
  CHECK_THROWS_WITH(x.at({2, 0}), Catch::Contains("at: index [2, 0] is out of range"));
  CHECK_THROWS_AS(x.data<std::int64_t>(), DTypeError);
  CHECK_THROWS_AS(randn({2}, DType::i64), DTypeError);
  CHECK_THROWS_AS(Device::parse("tpu"), DeviceError);
  CHECK(Device::parse("cuda:1") == cuda_device(1));
}

TEST_CASE("tensor memory comes from the CPU caching allocator with its category", "[tensor]") {
  auto& alloc = allocator_for(kCPU);
  const auto before = alloc.stats();
  Tensor t;
  {
    CategoryScope scope(MemoryCategory::activation);
    t = empty({1000});
  }
  const auto during = alloc.stats();
  CHECK(during.category(MemoryCategory::activation) -
            before.category(MemoryCategory::activation) ==
        4096);  // 4000 bytes rounded up to 512
  t = Tensor();
  CHECK(alloc.stats().category(MemoryCategory::activation) ==
        before.category(MemoryCategory::activation));
}

TEST_CASE("release_storage keeps the shape and makes any element access an error", "[tensor]") {
  Tensor t = full({3, 4}, 2.0);
  Tensor alias = t;  // another handle of the same tensor
  REQUIRE_FALSE(t.released());
  alias.release_storage();
  CHECK(t.released());
  CHECK(t.sizes() == Shape{3, 4});
  CHECK(t.numel() == 12);
  CHECK_THROWS_WITH(t.to_vector<float>(), Catch::Contains("tensor of shape [3, 4] was released"));
  CHECK_THROWS_AS(t.raw_data(), Error);
}

TEST_CASE("from_blob: a tensor over the caller's memory, no copy; the keeper goes with the last view", "[tensor]") {
  std::vector<float> mem = {0, 1, 2, 3, 4, 5};
  auto alive = std::make_shared<int>(0);
  std::weak_ptr<int> watch = alive;
  const std::int64_t before = allocator_for(kCPU).stats().allocated_bytes;
  {
    Tensor t = from_blob(mem.data(), {2, 3}, {3, 1}, DType::f32, std::move(alive));
    CHECK(t.raw_data() == mem.data());
    CHECK(values(t) == mem);
    CHECK(allocator_for(kCPU).stats().allocated_bytes == before);  // the allocator never saw it
    Tensor col = t.transpose(0, 1).select(0, 1);                    // a view keeps it too
    t = Tensor();
    CHECK_FALSE(watch.expired());
    col.fill_(7.0);  // writes land in the caller's memory
    CHECK(mem == std::vector<float>{0, 7, 2, 3, 7, 5});
    Tensor s = from_blob(mem.data(), {3, 2}, {1, 3}, DType::f32, std::make_shared<int>(0));  // strided
    CHECK(values(s) == std::vector<float>{0, 3, 7, 7, 2, 5});
  }
  CHECK(watch.expired());
  CHECK_THROWS_AS(from_blob(mem.data(), {2}, {-1}, DType::f32, std::make_shared<int>(0)), ShapeError);
  CHECK_THROWS_AS(from_blob(mem.data(), {2, 3}, {1}, DType::f32, std::make_shared<int>(0)), ShapeError);
  CHECK_THROWS_AS(from_blob(mem.data(), {2}, {1}, DType::f32, nullptr), Error);
}
