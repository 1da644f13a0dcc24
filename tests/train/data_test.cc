// BatchSampler (train/data.h): the fixed-length windows pinned against an
// independent re-derivation of the draw, and --seq-range's length per batch
// (reproducible from the seed, covering the range, resumable, windows inside
// their spans, clear errors).
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <set>
#include <vector>

#include "engine/error.h"
#include "engine/rng.h"
#include "train/data.h"

using namespace remat;

namespace {
// Span i holds tokens i * 1000 + j, so a window's tokens say where it came from.
struct Spans {
  std::vector<std::vector<std::uint16_t>> data;
  TokenSource source;
  explicit Spans(const std::vector<std::int64_t>& counts) {
    for (std::size_t i = 0; i < counts.size(); ++i) {
      std::vector<std::uint16_t> d(static_cast<std::size_t>(counts[i]));
      for (std::size_t j = 0; j < d.size(); ++j) d[j] = std::uint16_t(i * 1000 + j);
      data.push_back(std::move(d));
    }
    for (const auto& d : data) source.push_back(TokenSpan{d.data(), std::int64_t(d.size()), 2});
  }
};

// Every row is consecutive tokens of one span.
bool rows_inside_spans(const Tensor& batch) {
  const auto v = batch.to_vector<std::int64_t>();
  const std::int64_t B = batch.size(0), W = batch.size(1);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 1; i < W; ++i)
      if (v[std::size_t(b * W + i)] != v[std::size_t(b * W + i - 1)] + 1) return false;
  return true;
}

std::vector<std::uint8_t> bytes(std::int64_t n) {
  std::vector<std::uint8_t> d(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < d.size(); ++i) d[i] = std::uint8_t(i * 7 + i / 251);
  return d;
}
}  // namespace

TEST_CASE("BatchSampler without a range draws the windows it always drew", "[train][data]") {
  // One span: one Philox word per window, start = word % (count - seq), from (seed, 0).
  const std::vector<std::uint8_t> data = bytes(5000);
  const std::int64_t B = 4, S = 16;
  BatchSampler one(data, B, S, 9);
  const Tensor x = one.next();
  REQUIRE(x.sizes() == Shape{B, S + 1});
  std::vector<std::uint32_t> w(static_cast<std::size_t>(B));
  philox_fill_words(w.data(), B, RngState{9, 0});
  std::vector<std::int64_t> expect;
  for (std::int64_t b = 0; b < B; ++b) {
    const std::uint64_t start = w[std::size_t(b)] % std::uint64_t(5000 - S - 1 + 1);
    for (std::int64_t i = 0; i <= S; ++i) expect.push_back(data[std::size_t(start) + std::size_t(i)]);
  }
  CHECK(x.to_vector<std::int64_t>() == expect);

  // Several spans: two words per window (a 64-bit draw) over every span's starts.
  Spans spans({100, 10, 300});
  BatchSampler many(spans.source, B, S, 5);
  const auto y = many.next().to_vector<std::int64_t>();
  std::vector<std::uint32_t> w2(static_cast<std::size_t>(2 * B));
  philox_fill_words(w2.data(), 2 * B, RngState{5, 0});
  const std::int64_t per[3] = {100 - S, 0, 300 - S};  // (the 10-token span holds no window)
  for (std::int64_t b = 0; b < B; ++b) {
    std::uint64_t pick = (std::uint64_t(w2[std::size_t(2 * b)]) << 32 | w2[std::size_t(2 * b + 1)]) %
                         std::uint64_t(per[0] + per[2]);
    const std::int64_t span = pick < std::uint64_t(per[0]) ? 0 : 2;
    if (span == 2) pick -= std::uint64_t(per[0]);
    CHECK(y[std::size_t(b * (S + 1))] == span * 1000 + std::int64_t(pick));
  }
}

TEST_CASE("BatchSampler with a range: a length per batch, reproducible and covering the range", "[train][data]") {
  const std::vector<std::uint8_t> data = bytes(4000);
  const SeqRange range{4, 12};
  BatchSampler a(data, 3, range, 11), b(data, 3, range, 11);
  std::set<std::int64_t> seen;
  std::vector<std::int64_t> lengths;
  for (int i = 0; i < 200; ++i) {
    const Tensor x = a.next(), y = b.next();
    REQUIRE(x.dim() == 2);
    CHECK(x.size(0) == 3);
    const std::int64_t S = x.size(1) - 1;
    CHECK(S >= range.min);
    CHECK(S <= range.max);
    CHECK(x.sizes() == y.sizes());
    CHECK(x.to_vector<std::int64_t>() == y.to_vector<std::int64_t>());  // same seed: same lengths, same tokens
    seen.insert(S);
    lengths.push_back(S);
  }
  CHECK(seen.size() == std::size_t(range.max - range.min + 1));  // every length of [4, 12] drawn in 200 batches

  // Another seed draws other lengths.
  BatchSampler c(data, 3, range, 12);
  std::vector<std::int64_t> other;
  for (int i = 0; i < 200; ++i) other.push_back(c.next().size(1) - 1);
  CHECK(other != lengths);

  // A range of one length draws it every time.
  BatchSampler d(data, 2, SeqRange{7, 7}, 1);
  for (int i = 0; i < 5; ++i) CHECK(d.next().sizes() == Shape{2, 8});
}

TEST_CASE("BatchSampler with a range resumes exactly from state()", "[train][data]") {
  Spans spans({60, 5, 200, 33});
  BatchSampler s(spans.source, 4, SeqRange{2, 30}, 3);
  for (int i = 0; i < 7; ++i) s.next();
  const RngState st = s.state();
  std::vector<std::vector<std::int64_t>> after;
  std::vector<Shape> shapes;
  for (int i = 0; i < 10; ++i) {
    const Tensor x = s.next();
    CHECK(rows_inside_spans(x));  // windows never cross spans, whatever the length
    shapes.push_back(x.sizes());
    after.push_back(x.to_vector<std::int64_t>());
  }
  BatchSampler resumed(spans.source, 4, SeqRange{2, 30}, 999);  // (another seed: the state replaces it)
  resumed.set_state(st);
  for (int i = 0; i < 10; ++i) {
    const Tensor x = resumed.next();
    CHECK(x.sizes() == shapes[std::size_t(i)]);
    CHECK(x.to_vector<std::int64_t>() == after[std::size_t(i)]);
  }
}

TEST_CASE("BatchSampler with a range: short spans hold short windows only", "[train][data]") {
  // A span of 10 tokens holds windows of up to 10 tokens (S <= 9), never longer ones.
  Spans spans({10, 400});
  BatchSampler s(spans.source, 8, SeqRange{1, 40}, 4);
  bool short_span_used = false;
  for (int i = 0; i < 300; ++i) {
    const Tensor x = s.next();
    REQUIRE(rows_inside_spans(x));
    const auto v = x.to_vector<std::int64_t>();
    const std::int64_t W = x.size(1);
    for (std::int64_t b = 0; b < 8; ++b)
      if (v[std::size_t(b * W)] < 1000) {
        short_span_used = true;
        CHECK(W <= 10);
      }
  }
  CHECK(short_span_used);
}

TEST_CASE("BatchSampler and parse_seq_range refuse what cannot work", "[train][data]") {
  const std::vector<std::uint8_t> data = bytes(100);
  CHECK_THROWS_WITH(BatchSampler(data, 2, SeqRange{8, 200}, 0),
                    Catch::Contains("100 tokens of data are too few for windows of 201") &&
                        Catch::Contains("the range 8:200"));
  CHECK_THROWS_WITH(BatchSampler(data, 2, SeqRange{9, 8}, 0), Catch::Contains("1 <= min <= max"));
  CHECK_THROWS_WITH(BatchSampler(data, 2, SeqRange{0, 8}, 0), Catch::Contains("1 <= min <= max"));
  CHECK_NOTHROW(BatchSampler(data, 2, SeqRange{8, 98}, 0));

  const SeqRange r = parse_seq_range("64:512");
  CHECK(r.min == 64);
  CHECK(r.max == 512);
  CHECK(parse_seq_range("5:5").max == 5);
  CHECK_THROWS_WITH(parse_seq_range("32:8"), Catch::Contains("--seq-range 32:8: MIN (32) must be <= MAX (8)"));
  for (const char* bad : {"", "8", "8:", ":8", "0:8", "8:x", "-1:8", "8:16:32", "1e3:2e3"})
    CHECK_THROWS_WITH(parse_seq_range(bad), Catch::Contains("two integers >= 1 (e.g. 64:512)"));
  CHECK_THROWS_WITH(parse_seq_range("a:b", "bench --seq-range"), Catch::StartsWith("bench --seq-range 'a:b'"));
  const SeqRange lr = parse_seq_range("64:512:log");
  CHECK((lr.min == 64 && lr.max == 512 && lr.log));
  CHECK(!r.log);
  CHECK(seq_range_text(lr) == "64:512:log");
  CHECK(seq_range_text(r) == "64:512");
  for (const char* bad : {"64:512:", "64:512:lin", "64:log", ":log"})
    CHECK_THROWS_WITH(parse_seq_range(bad), Catch::Contains("expected MIN:MAX or MIN:MAX:log"));
}

TEST_CASE("log-uniform lengths: P(S) ~ 1/S over the range, the same for a seed", "[data]") {
  std::vector<std::uint8_t> data(20000);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = std::uint8_t(i * 7 % 251);
  auto lengths = [&](bool log, std::uint64_t seed) {
    BatchSampler s(data, 1, SeqRange{64, 511, log}, seed);
    std::vector<std::int64_t> out;
    for (int i = 0; i < 3000; ++i) out.push_back(s.next().size(1) - 1);
    return out;
  };
  const auto a = lengths(true, 5);
  CHECK(a == lengths(true, 5));
  CHECK(a != lengths(true, 6));
  // Each octave [64, 128), [128, 256), [256, 512) holds about a third of the
  // draws (log-uniform); uniform puts 1/7, 2/7 and 4/7 there.
  auto octaves = [](const std::vector<std::int64_t>& v) {
    std::array<double, 3> f{};
    for (std::int64_t s : v) {
      REQUIRE((s >= 64 && s <= 511));
      f[s < 128 ? 0 : s < 256 ? 1 : 2] += 1.0 / double(v.size());
    }
    return f;
  };
  for (double f : octaves(a)) CHECK(f == Approx(1.0 / 3).margin(0.04));
  const auto u = octaves(lengths(false, 5));
  CHECK(u[0] == Approx(1.0 / 7).margin(0.04));
  CHECK(u[2] == Approx(4.0 / 7).margin(0.04));
}
