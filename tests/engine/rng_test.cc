#include <catch2/catch.hpp>

#include <cmath>

#include "engine/error.h"
#include "engine/philox.h"
#include "engine/rng.h"
#include "engine/tensor.h"

using namespace remat;

// Known-answer vectors of Philox4x32-10 published with Random123
// (kat_vectors; Salmon et al., SC'11).
TEST_CASE("Philox4x32-10 matches the published known-answer vectors", "[rng]") {
  struct Kat {
    philox::Words ctr;
    std::uint32_t k0, k1;
    philox::Words expect;
  };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
       0xffffffffu,
       0xffffffffu,
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
       0xa4093822u,
       0x299f31d0u,
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const auto& k : kats) {
    const auto out = philox::philox4x32_10(k.ctr, k.k0, k.k1);
    for (int i = 0; i < 4; ++i) CHECK(out.v[i] == k.expect.v[i]);
  }
}

TEST_CASE("the stream layout: block b at counter offset + b, key = seed", "[rng]") {
  std::vector<std::uint32_t> words(10);
  const std::uint64_t seed = 0x299f31d0a4093822ull;
  const std::uint64_t offset = 0x85a308d3243f6a88ull;
  philox_fill_words(words.data(), 10, RngState{seed, offset});
  // Block 0 has counter {lo(offset), hi(offset), 0, 0}.
  const auto b0 = philox::philox4x32_10({{0x243f6a88u, 0x85a308d3u, 0, 0}}, 0xa4093822u, 0x299f31d0u);
  const auto b2 = philox::philox4x32_10({{0x243f6a8au, 0x85a308d3u, 0, 0}}, 0xa4093822u, 0x299f31d0u);
  for (int i = 0; i < 4; ++i) CHECK(words[std::size_t(i)] == b0.v[i]);
  CHECK(words[8] == b2.v[0]);
  CHECK(words[9] == b2.v[1]);
  // The offset's low word carries into the high word.
  std::uint32_t w = 0;
  philox_fill_words(&w, 1, RngState{0, 0xffffffffull + 1});
  CHECK(w == philox::philox4x32_10({{0, 1, 0, 0}}, 0, 0).v[0]);
}

TEST_CASE("generator state: reserve advances, set_state replays", "[rng]") {
  Generator g(1234);
  CHECK(g.state() == RngState{1234, 0});
  CHECK(g.reserve(10) == RngState{1234, 0});
  CHECK(g.state().offset == 3);  // ceil(10 / 4) blocks
  const RngState saved = g.state();
  Tensor a = randn({3, 5}, {}, &g);
  Tensor b = rand({7}, {}, &g);
  g.set_state(saved);
  Tensor a2 = randn({3, 5}, {}, &g);
  Tensor b2 = rand({7}, {}, &g);
  CHECK(a.to_vector<float>() == a2.to_vector<float>());
  CHECK(b.to_vector<float>() == b2.to_vector<float>());
  CHECK(a.to_vector<float>() != randn({3, 5}, {}, &g).to_vector<float>());
  // A shorter draw is a prefix of a longer one from the same state.
  std::vector<float> small(10), large(100);
  philox_fill_normal(small.data(), 10, RngState{5, 77});
  philox_fill_normal(large.data(), 100, RngState{5, 77});
  CHECK(std::equal(small.begin(), small.end(), large.begin()));
}

TEST_CASE("manual_seed makes the default generator reproducible", "[rng]") {
  manual_seed(42);
  Tensor a = randn({16});
  manual_seed(42);
  Tensor b = randn({16});
  CHECK(a.to_vector<float>() == b.to_vector<float>());
  CHECK(randn({4}, DType::bf16).dtype() == DType::bf16);
}

TEST_CASE("uniform and normal draws have the right moments", "[rng]") {
  const std::int64_t n = 1 << 20;
  std::vector<float> u(static_cast<std::size_t>(n)), z(static_cast<std::size_t>(n));
  philox_fill_uniform(u.data(), n, RngState{7, 0});
  philox_fill_normal(z.data(), n, RngState{7, 1 << 20});
  double su = 0, mn = 1, mx = 0;
  for (float v : u) {
    su += v;
    mn = std::min<double>(mn, v);
    mx = std::max<double>(mx, v);
  }
  CHECK(mn >= 0.0);
  CHECK(mx < 1.0);
  CHECK(su / double(n) == Approx(0.5).margin(2e-3));
  double s1 = 0, s2 = 0, s4 = 0;
  for (float v : z) {
    s1 += v;
    s2 += double(v) * v;
    s4 += double(v) * v * v * v;
  }
  CHECK(s1 / double(n) == Approx(0.0).margin(5e-3));
  CHECK(s2 / double(n) == Approx(1.0).margin(5e-3));
  CHECK(s4 / double(n) == Approx(3.0).margin(3e-2));  // kurtosis of a normal
}

TEST_CASE("libm-free transforms are accurate", "[rng]") {
  double max_log_err = 0, max_trig_err = 0;
  for (int i = 1; i <= 1 << 16; ++i) {
    const float u = float(i) / float(1 << 16);
    max_log_err = std::max(max_log_err, std::abs(double(philox::log_unit(u)) - std::log(double(u))));
    float s, c;
    philox::sincos_turns(u * 0.999f, s, c);
    const double a = 2 * M_PI * double(u * 0.999f);
    max_trig_err = std::max({max_trig_err, std::abs(double(s) - std::sin(a)),
                             std::abs(double(c) - std::cos(a))});
  }
  CHECK(max_log_err < 2e-6);
  CHECK(max_trig_err < 2e-6);
}

TEST_CASE("keyed streams: unit u of micro-batch m draws the same values in any order", "[rng]") {
  Generator gen(11);
  const RngState start{11, 40};
  // The values block `unit` of micro-batch `micro` draws first.
  auto draw = [&](std::int64_t micro, std::int64_t unit) {
    RngStreamScope keyed(gen, start, micro, 3);
    enter_rng_stream(unit);
    float v[6];
    philox_fill_uniform(v, 6, gen.reserve(6));
    return std::vector<float>(v, v + 6);
  };
  const auto a = draw(1, 2);
  gen.set_state({11, 999});  // whatever ran before
  (void)draw(0, 1);
  CHECK(draw(1, 2) == a);
  CHECK(draw(2, 1) != a);
  {
    RngStreamScope keyed(gen, start, 1, 3);
    enter_rng_stream(2);
    CHECK(gen.state() == RngState{11, 40 + (1 * 3 + 2) * kRngStreamBlocks});
    CHECK_THROWS_WITH(enter_rng_stream(3), Catch::Contains("unit 3 outside [0, 3)"));
    // A unit that overruns its stream is named when the next one is entered.
    gen.reserve(4 * kRngStreamBlocks + 4);
    CHECK_THROWS_WITH(enter_rng_stream(0), Catch::Contains("unit 2 of micro-batch 1 drew"));
  }
  // Outside a scope entering a stream changes nothing.
  gen.set_state({11, 7});
  enter_rng_stream(5);
  CHECK(gen.state() == RngState{11, 7});
  CHECK(rng_streams_end(start, 4, 3) == RngState{11, 40 + 12 * kRngStreamBlocks});
  CHECK_THROWS_AS(RngStreamScope(gen, start, -1, 3), Error);
}
