// Init recipes (models/layers.h): a model built on meta under an
// InitRecorder records, for every parameter, how its values are drawn, and
// any range of them made alone equals the same elements of the model built
// with values (what --zero 3 relies on to build each rank's shards).
#include <catch2/catch.hpp>

#include <random>

#include "engine/device.h"
#include "engine/rng.h"
#include "models/decoder.h"
#include "models/layers.h"

using namespace remat;

TEST_CASE("init recipes: any range of a parameter equals the whole draw's elements", "[models][zero]") {
  for (const char* name : {"tiny", "tiny-moe"}) {
    INFO(name);
    const ModelConfig c = ModelConfig::named(name);
    manual_seed(3);
    const DecoderModel drawn(c, 3);
    const RngState after_drawn = default_generator().state();
    manual_seed(3);
    InitRecorder recorder;
    std::unique_ptr<DecoderModel> shapes;
    {
      DefaultDeviceScope meta(kMeta);
      shapes = std::make_unique<DecoderModel>(c, 3);
    }
    // The recorded build advanced the stream as drawing does.
    CHECK(default_generator().state() == after_drawn);
    const auto want = drawn.named_parameters(), got = shapes->named_parameters();
    REQUIRE(want.size() == got.size());
    std::mt19937_64 rng(7);
    for (std::size_t i = 0; i < want.size(); ++i) {
      INFO(want[i].first);
      REQUIRE(want[i].first == got[i].first);
      const InitRecipe& r = recorder.recipe(got[i].second);
      const Tensor flat = want[i].second.contiguous().view({-1});
      const std::int64_t n = flat.numel();
      // The whole parameter, and ranges starting anywhere in a Philox block.
      std::vector<std::pair<std::int64_t, std::int64_t>> ranges = {{0, n}};
      for (int k = 0; k < 6; ++k) {
        const std::int64_t b = std::int64_t(rng() % std::uint64_t(n));
        ranges.emplace_back(b, 1 + std::int64_t(rng() % std::uint64_t(n - b)));
      }
      for (const auto& [b, len] : ranges) {
        Tensor out = empty({len});
        fill_init_range(r, b, out);
        const auto w = flat.narrow(0, b, len).contiguous().to_vector<float>(), g = out.to_vector<float>();
        INFO("range [" << b << ", " << b + len << ")");
        CHECK(w == g);
      }
    }
  }
  Tensor p = empty({4});
  CHECK_THROWS_WITH(InitRecorder().recipe(p), Catch::Contains("no recipe for a parameter of shape [4]"));
}
