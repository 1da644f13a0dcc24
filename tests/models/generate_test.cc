// Generation with the KV cache (models/generate.h): the cached forward gives
// the logits of the whole-sequence forward, the prefill's last position alone
// (last_only) those of the full prefill's last row, greedy decoding with the cache
// equals greedy decoding recomputed without it, and sampling follows its
// options.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <set>

#include "engine/error.h"
#include "engine/grad_mode.h"
#include "models/decoder.h"
#include "models/generate.h"
#include "tests/models/llama_style_config.h"

using namespace remat;

namespace {
// remat's decoders and the Hugging Face architectures' features:
// grouped-query attention with a head dim other than d / heads, tied
// embeddings, attention biases (Llama); one key/value head, a gated shared
// expert, raw top-K weights, a dense layer (Qwen2-MoE); Mixtral's experts.
std::vector<ModelConfig> configs() {
  const ModelConfig llama = testing::llama_style_config();
  ModelConfig qmoe = ModelConfig::named("tiny-moe");
  qmoe.name = "qwen2-moe-style";
  qmoe.arch = "qwen2_moe";
  qmoe.kv_heads = 1;
  qmoe.qkv_bias = true;
  qmoe.shared = 0;
  qmoe.shared_ffn = 96;
  qmoe.shared_gate = true;
  qmoe.norm_topk = false;
  qmoe.dense_first = 0;
  qmoe.dense_layers = {2};
  ModelConfig mix = ModelConfig::named("tiny-moe");
  mix.name = "mixtral-style";
  mix.arch = "mixtral";
  mix.kv_heads = 2;
  mix.shared = 0;
  mix.dense_first = 0;
  mix.moe_ffn = mix.ffn;
  return {ModelConfig::named("tiny"), ModelConfig::named("tiny-moe"), llama, qmoe, mix};
}

std::vector<std::int32_t> prompt_of(std::int64_t n, std::int64_t vocab) {
  std::vector<std::int32_t> p;
  for (std::int64_t i = 0; i < n; ++i) p.push_back(std::int32_t((i * 37 + 11) % vocab));
  return p;
}
}  // namespace

TEST_CASE("generate: cached logits equal the whole sequence's", "[generate]") {
  for (const ModelConfig& c : configs()) {
    INFO(c.name);
    DecoderModel model(c, 1);
    model.train(false);
    NoGradGuard ng;
    const auto ids = prompt_of(24, c.vocab);
    std::vector<std::int64_t> v(ids.begin(), ids.end());
    const Tensor whole = model.forward(from_vector<std::int64_t>(v, {1, 24}));
    // Prefill 10, then 14 one at a time (the 2-token step tests the mask).
    KVCache cache;
    std::vector<Tensor> parts;
    std::vector<std::int64_t> head(v.begin(), v.begin() + 10);
    parts.push_back(model.forward_cached(from_vector<std::int64_t>(head, {1, 10}), cache));
    std::int64_t at = 10;
    while (at < 24) {
      const std::int64_t n = at == 12 ? 2 : 1;
      std::vector<std::int64_t> step(v.begin() + at, v.begin() + at + n);
      parts.push_back(model.forward_cached(from_vector<std::int64_t>(step, {1, n}), cache));
      at += n;
    }
    CHECK(cache.length() == 24);
    const auto w = whole.to_vector<float>();
    std::vector<float> got;
    for (const auto& p : parts)
      for (float x : p.to_vector<float>()) got.push_back(x);
    REQUIRE(got.size() == w.size());
    double worst = 0, scale = 0;
    for (std::size_t i = 0; i < w.size(); ++i) {
      worst = std::max(worst, double(std::abs(got[i] - w[i])));
      scale = std::max(scale, double(std::abs(w[i])));
    }
    CHECK(worst <= 1e-4 * scale);
  }
}

TEST_CASE("generate: a prefill of the last position's logits only gives that row of the full logits",
          "[generate]") {
  for (const ModelConfig& c : configs()) {
    INFO(c.name);
    DecoderModel model(c, 1);
    model.train(false);
    const auto ids = prompt_of(17, c.vocab);
    std::vector<std::int64_t> v(ids.begin(), ids.end());
    const Tensor prompt = from_vector<std::int64_t>(v, {1, 17});
    KVCache all, last;
    const Tensor full = model.forward_cached(prompt, all);
    const Tensor one = model.forward_cached(prompt, last, /*last_only=*/true);
    REQUIRE(full.sizes() == Shape{1, 17, c.vocab});
    REQUIRE(one.sizes() == Shape{1, 1, c.vocab});
    CHECK(one.to_vector<float>() == full.narrow(1, 16, 1).contiguous().to_vector<float>());
    // The cache is the whole prompt's either way: the next step's logits agree.
    CHECK(last.length() == 17);
    const Tensor next = from_vector<std::int64_t>({std::int64_t(5 % c.vocab)}, {1, 1});
    CHECK(model.forward_cached(next, last, true).to_vector<float>() == model.forward_cached(next, all).to_vector<float>());
  }
}

TEST_CASE("generate: greedy with the KV cache equals greedy recomputed without it", "[generate]") {
  for (const ModelConfig& c : configs()) {
    INFO(c.name);
    DecoderModel model(c, 2);
    model.train(false);
    const auto prompt = prompt_of(7, c.vocab);
    GenerateOptions o;
    o.temperature = 0;
    o.max_new = 24;
    std::vector<std::int32_t> streamed;
    const auto cached = generate(model, prompt, o, [&](std::int32_t t) { streamed.push_back(t); });
    CHECK(cached == streamed);
    CHECK(cached.size() == 24);
    CHECK(cached == generate_greedy_uncached(model, prompt, 24));
  }
}

TEST_CASE("generate: sampling options and errors", "[generate]") {
  const std::vector<float> logits = {0.0f, 3.0f, 2.5f, -1.0f, 2.9f};
  GenerateOptions o;
  o.temperature = 0;
  CHECK(sample_token(logits, o, 0.99f) == 1);
  o.temperature = 1;
  o.top_k = 1;
  for (float u : {0.0f, 0.5f, 0.999f}) CHECK(sample_token(logits, o, u) == 1);
  o.top_k = 0;
  o.top_p = 0.01;  // the most likely alone reaches it
  CHECK(sample_token(logits, o, 0.9f) == 1);
  o.top_p = 1;
  o.top_k = 3;  // 1, 4, 2 remain
  std::map<std::int32_t, int> seen;
  for (int i = 0; i < 100; ++i) seen[sample_token(logits, o, float(i) / 100.0f)]++;
  CHECK(seen.size() == 3);
  CHECK(seen.count(1));
  CHECK(seen.count(4));
  CHECK(seen.count(2));
  // Low temperature concentrates on the argmax.
  o.top_k = 0;
  o.temperature = 0.01;
  CHECK(sample_token(logits, o, 0.9f) == 1);
  // Greedy ties go to the lowest id.
  o.temperature = 0;
  CHECK(sample_token({1.0f, 5.0f, 5.0f, 2.0f}, o, 0.5f) == 1);
  CHECK(sample_token({7.0f, 7.0f}, o, 0.99f) == 0);
  // An intermediate top-p: by probability 1 (0.388), 4 (0.351), 2 (0.235),
  // ...; 0.7 keeps {1, 4} (0.739 >= 0.7), 0.74 keeps {1, 4, 2}.
  o.temperature = 1;
  o.top_p = 0.7;
  std::set<std::int32_t> kept;
  for (int i = 0; i < 200; ++i) kept.insert(sample_token(logits, o, float(i) / 200.0f));
  CHECK(kept == std::set<std::int32_t>{1, 4});
  // Within {1, 4} the draw splits at p1 / (p1 + p4) = 1 / (1 + e^-0.1) = 0.52498.
  CHECK(sample_token(logits, o, 0.5245f) == 1);
  CHECK(sample_token(logits, o, 0.5255f) == 4);
  o.top_p = 0.74;
  kept.clear();
  for (int i = 0; i < 200; ++i) kept.insert(sample_token(logits, o, float(i) / 200.0f));
  CHECK(kept == std::set<std::int32_t>{1, 2, 4});
  o.top_p = 1;

  const ModelConfig c = ModelConfig::named("tiny");
  DecoderModel model(c, 0);
  model.train(false);
  GenerateOptions g;
  g.max_new = 5;
  g.seed = 9;
  const auto a = generate(model, {1, 2, 3}, g), b = generate(model, {1, 2, 3}, g);
  CHECK(a == b);  // the seed fixes the samples
  GenerateOptions other = g;
  other.seed = 10;
  other.max_new = 16;
  g.max_new = 16;
  CHECK(generate(model, {1, 2, 3}, g) != generate(model, {1, 2, 3}, other));  // another seed, other samples
  g.max_new = 5;
  g.stop = a[1];
  CHECK(generate(model, {1, 2, 3}, g).size() <= 2);
  CHECK_THROWS_WITH(generate(model, {}, g), Catch::Contains("no tokens"));
  CHECK_THROWS_WITH(generate(model, {int(c.vocab)}, g), Catch::Contains("outside the vocabulary"));
  g.temperature = -1;
  CHECK_THROWS_WITH(generate(model, {1}, g), Catch::Contains("--temperature"));
}
