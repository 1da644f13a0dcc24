// linear_cross_entropy (ops/linear_cross_entropy.h): the chunked head + loss
// against the unchunked pair cross_entropy(linear(h, w)): the same bits at
// chunks that are multiples of the GEMM's reduction block, within rounding at
// any chunk; ignored targets, 16-bit inputs, memory and bad input.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/allocator.h"
#include "ops/ops.h"
#include "tests/ops/gradcheck.h"

using namespace remat;
using namespace remat::testing;

namespace {

struct Result {
  std::vector<float> loss, dh, dw;
};

// Loss and the gradients of h and w, from the fused op (chunk > 0) or the pair.
Result run(const Tensor& h0, const Tensor& w0, const Tensor& t, std::int64_t chunk, DType dtype = DType::f32) {
  Tensor h = h0.to(dtype).detach(), w = w0.to(dtype).detach();
  h.set_requires_grad(true);
  w.set_requires_grad(true);
  Tensor loss = chunk > 0 ? linear_cross_entropy(h, w, t, chunk) : cross_entropy(linear(h, w), t);
  loss.backward();
  return {loss.to_vector<float>(), h.grad().to(DType::f32).to_vector<float>(),
          w.grad().to(DType::f32).to_vector<float>()};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 0, diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::fabs(double(a[i])));
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

Tensor targets(std::int64_t rows, std::int64_t vocab, std::uint64_t seed, std::int64_t every_ignored = 0) {
  std::vector<std::int64_t> t(static_cast<std::size_t>(rows));
  std::uint64_t x = seed;
  for (std::int64_t i = 0; i < rows; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    t[std::size_t(i)] = every_ignored > 0 && i % every_ignored == 0 ? -100 : std::int64_t((x >> 33) % vocab);
  }
  return from_vector<std::int64_t>(t, {rows});
}

}  // namespace

TEST_CASE("linear_cross_entropy: the unchunked pair's bits at multiples of the reduction block", "[ops][loss]") {
  const std::int64_t tile = loss_chunk_tile(kCPU);
  INFO("tile " << tile);
  REQUIRE(tile >= 1);
  // Rows not a multiple of the tile (a short last chunk), d above and below it.
  const std::int64_t rows = 2 * tile + 37, vocab = 97;
  for (std::int64_t d : {std::int64_t(40), tile + 24}) {
    INFO("d " << d);
    const Tensor h = normal({rows, d}, 1, 0.5), w = normal({vocab, d}, 2, 0.3), t = targets(rows, vocab, 3, 11);
    const Result ref = run(h, w, t, 0);
    for (std::int64_t chunk : {tile, 2 * tile, rows, 4 * tile}) {
      INFO("chunk " << chunk);
      const Result got = run(h, w, t, chunk);
      CHECK(same_bits(got.loss, ref.loss));
      CHECK(same_bits(got.dh, ref.dh));
      CHECK(same_bits(got.dw, ref.dw));
    }
  }
}

TEST_CASE("linear_cross_entropy: any chunk within 1e-6 of the unchunked pair", "[ops][loss]") {
  const std::int64_t rows = 300, d = 48, vocab = 131;
  const Tensor h = normal({3, 100, d}, 4, 0.5), w = normal({vocab, d}, 5, 0.3);
  const Tensor t = targets(rows, vocab, 6, 7).view({3, 100});
  const Result ref = run(h, w, t, 0);
  for (std::int64_t chunk : {1, 7, 100, 129, 299}) {
    INFO("chunk " << chunk);
    const Result got = run(h, w, t, chunk);
    std::size_t first = 0;
    while (first < got.dh.size() && got.dh[first] == ref.dh[first]) ++first;
    INFO("first differing dh element " << first << " loss same " << same_bits(got.loss, ref.loss));
    CHECK(same_bits(got.dh, ref.dh));  // rows are independent: dh never depends on the chunk
    CHECK(max_rel(got.loss, ref.loss) < 1e-6);
    CHECK(max_rel(got.dw, ref.dw) < 1e-6);
  }
}

TEST_CASE("linear_cross_entropy: every target ignored gives 0 and zero gradients", "[ops][loss]") {
  const Tensor h = normal({5, 8}, 7), w = normal({11, 8}, 8);
  const Tensor t = from_vector<std::int64_t>({-100, -100, -100, -100, -100}, {5});
  const Result got = run(h, w, t, 2);
  CHECK(got.loss[0] == 0.0f);
  CHECK(std::all_of(got.dh.begin(), got.dh.end(), [](float v) { return v == 0.0f; }));
  CHECK(std::all_of(got.dw.begin(), got.dw.end(), [](float v) { return v == 0.0f; }));
}

TEST_CASE("linear_cross_entropy: 16-bit inputs give f32 logits", "[ops][loss]") {
  const std::int64_t tile = loss_chunk_tile(kCPU);
  const Tensor h = normal({tile + 5, 16}, 9, 0.5), w = normal({23, 16}, 10, 0.3), t = targets(tile + 5, 23, 11);
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    // The f32 pair on the 16-bit values: the fused op's logits are exactly these.
    const Result ref = run(h.to(dt).to(DType::f32), w.to(dt).to(DType::f32), t, 0);
    const Result got = run(h, w, t, tile, dt);
    CHECK(same_bits(got.loss, ref.loss));
    CHECK(max_rel(got.dh, ref.dh) < 1e-2);  // rounded to the 16-bit dtype
    CHECK(max_rel(got.dw, ref.dw) < 1e-2);
  }
}

TEST_CASE("linear_cross_entropy: one chunk's logits at a time", "[ops][loss]") {
  const std::int64_t rows = 1024, d = 16, vocab = 2000, chunk = 128;
  const Tensor h = normal({rows, d}, 12), w = normal({vocab, d}, 13), t = targets(rows, vocab, 14);
  auto& alloc = allocator_for(kCPU);
  Tensor hh = h.detach(), ww = w.detach();
  hh.set_requires_grad(true);
  ww.set_requires_grad(true);
  alloc.reset_peak();
  const std::int64_t base = alloc.stats().allocated_bytes;
  linear_cross_entropy(hh, ww, t, chunk).backward();
  const std::int64_t extra = alloc.stats().allocated_peak - base;
  const std::int64_t logits = rows * vocab * 4, one_chunk = chunk * vocab * 4;
  INFO("peak above the start " << extra << " bytes; whole logits " << logits << ", one chunk's " << one_chunk);
  // Two chunks' worth (logits and their gradient) and the gradients of h and w.
  CHECK(extra < 2 * one_chunk + (rows + vocab) * d * 4 + rows * 16 + 64 * 1024);
  CHECK(extra < logits / 3);
}

TEST_CASE("linear_cross_entropy: bad input names the op, the shapes and what was expected", "[ops][loss]") {
  const Tensor h = normal({4, 8}, 15), w = normal({10, 8}, 16), t = targets(4, 10, 17);
  CHECK_THROWS_WITH(linear_cross_entropy(h, w, t, 0), Catch::Contains("linear_cross_entropy: chunk must be at least 1"));
  CHECK_THROWS_WITH(linear_cross_entropy(h, normal({10, 9}, 18), t, 2),
                    Catch::Contains("linear_cross_entropy: hidden states [4, 8] f32 cpu do not match weight [10, 9]"));
  CHECK_THROWS_WITH(linear_cross_entropy(h, w, targets(3, 10, 19), 2),
                    Catch::Contains("expected targets of shape [4]"));
  CHECK_THROWS_WITH(linear_cross_entropy(h, w, from_vector<std::int64_t>({0, 1, 10, 2}, {4}), 2),
                    Catch::Contains("linear_cross_entropy: target 10 at position 2 is out of range for 10 classes"));
  CHECK_THROWS_WITH(linear_cross_entropy(h, w.to(DType::bf16), t, 2), Catch::Contains("linear_cross_entropy"));
}
