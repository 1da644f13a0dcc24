// Fine-tuning in the model (#40; models/lora.h, models/module.h): LoRA's
// term, its initial values and names, freezing by glob, and every lossless
// plan with adapters or frozen parameters bit-identical to `none` (both
// checkpoint variants: under LoRA or a frozen embedding no region input
// requires grad).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "checkpoint/plan.h"
#include "engine/error.h"
#include "engine/grad_mode.h"
#include "engine/rng.h"
#include "models/decoder.h"
#include "models/lora.h"
#include "models/recompute.h"
#include "ops/ops.h"
#include "tests/models/llama_style_config.h"
#include "tests/models/model_test_util.h"

using namespace remat;

namespace {

using testing::same_bits;
using testing::token_ids;

struct Step {
  float loss = 0;
  std::map<std::string, std::vector<float>> grads;
  std::set<std::string> without_grad;
};

// One forward_loss + backward of a fresh model (seed 3) under `plan`.
Step step(const ModelConfig& c, const std::string& plan) {
  DecoderModel model(c, 3);
  // (B nonzero, so that the adapters change the output and the base's gradients flow through them)
  {
    NoGradGuard ng;
    Generator g(11);
    for (auto& [name, p] : model.named_parameters())
      if (name.find(".lora_B.") != std::string::npos) {
        Tensor b = p;
        b.copy_(mul(randn(p.sizes(), DType::f32, &g), 0.02));
      }
  }
  apply_recompute_plan(model, RecomputePlan::parse(plan, c.n_layers));
  Tensor loss = model.forward_loss(token_ids(2, 33, c.vocab, 7)).loss;
  loss.backward();
  Step s;
  s.loss = loss.to_vector<float>().at(0);
  for (const auto& [name, p] : model.named_parameters()) {
    if (p.grad().defined())
      s.grads[name] = p.grad().to_vector<float>();
    else
      s.without_grad.insert(name);
  }
  return s;
}

// Each plan's step has none's loss and gradients, bit for bit, and leaves
// the same parameters without a gradient.
void check_plans(const ModelConfig& c, const Step& none, const std::vector<std::string>& plans) {
  for (const std::string& plan : plans) {
    INFO(plan);
    const Step s = step(c, plan);
    CHECK(same_bits({s.loss}, {none.loss}));
    CHECK(s.without_grad == none.without_grad);
    REQUIRE(s.grads.size() == none.grads.size());
    for (const auto& [name, g] : none.grads) {
      INFO(name);
      CHECK(same_bits(s.grads.at(name), g));
    }
  }
}

ModelConfig with_lora(ModelConfig c, const std::string& spec) {
  c.lora = LoraConfig::parse(spec);
  return c;
}

}  // namespace

TEST_CASE("lora: the spec parses, prints back and refuses bad values", "[models][lora]") {
  const LoraConfig c = LoraConfig::parse("r=16,alpha=32,dropout=0.05,targets=q_proj,v_proj");
  CHECK(c.r == 16);
  CHECK(c.alpha == 32);
  CHECK(c.dropout == 0.05);
  CHECK(c.targets == std::vector<std::string>{"q_proj", "v_proj"});
  CHECK(c.scaling() == 2.0);
  CHECK(LoraConfig::parse(c.str()) == c);
  const LoraConfig d = LoraConfig::parse("r=8");
  CHECK(d.alpha == 16);
  CHECK(d.targets == default_lora_targets());
  for (const std::string bad : {"r=0", "r=1.5", "alpha=4", "r=4,alpha=0", "r=4,alpha=-1", "r=4,dropout=1",
                                "r=4,rank=3", "r=4,targets=", "r=4,targets=q_proj,alpha=3", "r", "r=x"}) {
    INFO(bad);
    CHECK_THROWS_AS(LoraConfig::parse(bad), Error);
  }
  CHECK_THROWS_WITH(LoraConfig::parse("r=0"), Catch::Contains("r must be an integer >= 1"));
  CHECK_THROWS_WITH(LoraConfig::parse("r=4,alpha=0"), Catch::Contains("alpha must be > 0"));
}

TEST_CASE("lora: adapters are named as PEFT names them, A drawn Kaiming-uniform, B zero, the rest frozen",
          "[models][lora]") {
  const ModelConfig c = with_lora(testing::llama_style_config(), "r=4,alpha=8");
  DecoderModel model(c, 1);
  std::int64_t adapters = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    INFO(name);
    if (!is_lora_parameter(name)) {
      CHECK_FALSE(p.requires_grad());
      continue;
    }
    ++adapters;
    CHECK(p.requires_grad());
    const std::string base = name.substr(0, name.find(".lora_"));
    const Tensor w = model.parameter(base + ".weight");
    if (name.find(".lora_A.weight") != std::string::npos) {
      CHECK(p.sizes() == Shape{4, w.size(1)});
      const double bound = 1.0 / std::sqrt(double(w.size(1)));
      double most = 0;
      for (float v : p.to_vector<float>()) most = std::max(most, double(std::abs(v)));
      CHECK(most <= bound);
      CHECK(most > 0.8 * bound);  // (spread over the range)
    } else {
      REQUIRE(name.size() > 14);
      CHECK(name.substr(name.size() - 14) == ".lora_B.weight");
      CHECK(p.sizes() == Shape{w.size(0), 4});
      for (float v : p.to_vector<float>()) CHECK(v == 0.0f);
    }
  }
  CHECK(adapters == 2 * 7 * c.n_layers);
  CHECK(model.parameter("model.layers.0.self_attn.q_proj.lora_A.weight").defined());
  // A fresh adapter changes nothing: the same loss as the model without one.
  ModelConfig plain = testing::llama_style_config();
  DecoderModel base(plain, 1);
  const Tensor tokens = token_ids(2, 17, c.vocab, 2);
  CHECK(same_bits(model.forward_loss(tokens).loss.to_vector<float>(), base.forward_loss(tokens).loss.to_vector<float>()));
  // The same adapters whatever the seed stream of the base: keyed by name.
  DecoderModel again(c, 1);
  CHECK(same_bits(again.parameter("model.layers.1.mlp.up_proj.lora_A.weight").to_vector<float>(),
                  model.parameter("model.layers.1.mlp.up_proj.lora_A.weight").to_vector<float>()));
}

TEST_CASE("lora: the term is scaling * (x A^T) B^T, the gradients reach A and B only", "[models][lora]") {
  ModelConfig c = ModelConfig::named("tiny");
  c.lora = LoraConfig::parse("r=2,alpha=3,targets=q_proj");
  DecoderModel model(c, 4);
  const auto& q = *model.model->layers[0]->self_attn->q_proj;
  REQUIRE(q.has_lora());
  Generator g(9);
  {
    NoGradGuard ng;
    Tensor b = q.lora_B;
    b.copy_(randn(b.sizes(), DType::f32, &g));
  }
  const Tensor x = randn({3, c.d_model}, DType::f32, &g);
  const Tensor y = q.forward(x);
  const std::vector<float> xv = x.to_vector<float>(), w = q.weight.to_vector<float>(), a = q.lora_A.to_vector<float>(),
                           b = q.lora_B.to_vector<float>();
  const std::vector<float> yv = y.to_vector<float>();
  const std::int64_t in = c.d_model, out = q.weight.size(0), r = 2;
  for (std::int64_t i = 0; i < 3; ++i)
    for (std::int64_t o = 0; o < out; ++o) {
      double base = 0, lora = 0;
      for (std::int64_t k = 0; k < in; ++k) base += double(xv[i * in + k]) * double(w[o * in + k]);
      for (std::int64_t j = 0; j < r; ++j) {
        double xa = 0;
        for (std::int64_t k = 0; k < in; ++k) xa += double(xv[i * in + k]) * double(a[j * in + k]);
        lora += xa * double(b[o * r + j]);
      }
      CHECK(std::abs(double(yv[i * out + o]) - (base + 1.5 * lora)) <= 1e-4 * (1 + std::abs(base + 1.5 * lora)));
    }
  sum(y).backward();
  CHECK(q.lora_A.grad().defined());
  CHECK(q.lora_B.grad().defined());
  CHECK_FALSE(q.weight.grad().defined());
}

TEST_CASE("lora: bad targets are refused before any change", "[models][lora]") {
  ModelConfig c = ModelConfig::named("tiny");
  c.lora = LoraConfig::parse("r=2,targets=q_proj,qkv_proj");
  CHECK_THROWS_WITH(DecoderModel(c, 0), Catch::Contains("target 'qkv_proj' matches no Linear") &&
                                            Catch::Contains("q_proj"));
  ModelConfig m = ModelConfig::named("tiny-moe");
  m.lora = LoraConfig::parse("r=2,targets=gate");
  CHECK_THROWS_WITH(DecoderModel(m, 0), Catch::Contains("MoE router"));
  ModelConfig h = ModelConfig::named("tiny");
  h.lora = LoraConfig::parse("r=2,targets=lm_head");
  CHECK_THROWS_WITH(DecoderModel(h, 0), Catch::Contains("LM head"));
}

TEST_CASE("freeze: globs with number ranges; a pattern that matches nothing is an error", "[models][lora]") {
  CHECK(name_matches("model.layers.[0-11].*", "model.layers.11.mlp.up_proj.weight"));
  CHECK(name_matches("model.layers.[0-11].*", "model.layers.0.mlp.up_proj.weight"));
  CHECK_FALSE(name_matches("model.layers.[0-11].*", "model.layers.12.mlp.up_proj.weight"));
  CHECK_FALSE(name_matches("model.layers.[0-11].*", "model.layers.01.mlp.up_proj.weight"));
  CHECK(name_matches("model.embed_tokens.*", "model.embed_tokens.weight"));
  CHECK(name_matches("*.q_proj.?eight", "model.layers.3.self_attn.q_proj.weight"));
  CHECK_FALSE(name_matches("*.q_proj", "model.layers.3.self_attn.q_proj.weight"));
  CHECK_THROWS_WITH(name_matches("model.layers.[3-1].*", "x"), Catch::Contains("A <= B"));
  CHECK_THROWS_WITH(name_matches("model.layers.[1-2.*", "x"), Catch::Contains("[A-B]"));
  ModelConfig c = ModelConfig::named("tiny");
  c.freeze = {"model.embed_tokens.*", "model.layers.[0-1].*"};
  DecoderModel model(c, 0);
  for (const auto& [name, p] : model.named_parameters()) {
    INFO(name);
    const bool frozen = name.rfind("model.embed_tokens.", 0) == 0 || name.rfind("model.layers.0.", 0) == 0 ||
                        name.rfind("model.layers.1.", 0) == 0;
    CHECK(p.requires_grad() == !frozen);
  }
  c.freeze = {"model.embed_tokens.*", "model.nothing.*"};
  CHECK_THROWS_WITH(DecoderModel(c, 0), Catch::Contains("'model.nothing.*' matches no parameter"));
}

TEST_CASE("lora + frozen parameters: every lossless plan, both checkpoint variants, bit-identical to none",
          "[models][lora]") {
  ModelConfig frozen_embed = ModelConfig::named("tiny");
  frozen_embed.freeze = {"model.embed_tokens.*"};
  const std::vector<ModelConfig> configs = {with_lora(testing::llama_style_config(), "r=4,alpha=8"),
                                            with_lora(ModelConfig::named("tiny-moe"), "r=2,alpha=4"), frozen_embed};
  for (const ModelConfig& c : configs) {
    INFO(c.name << " lora " << c.lora.str());
    const Step none = step(c, "none");
    REQUIRE(!none.grads.empty());
    REQUIRE(!none.without_grad.empty());
    check_plans(c, none, {"per_block", "per_block+keep_last", "chunk", "selective:core_attn", "selective:mlp",
                          "attention", "selective:save_matmul", "chunked_loss", "offload"});
    // The reentrant variant (over MoE blocks, the router losses leave each
    // region as outputs of its own): no input of a region requires grad when
    // the embedding is frozen, and the adapters and inner parameters still
    // get the gradients of none.
    check_plans(c, none, {"per_block:reentrant", "uniform:2:reentrant", "chunk:reentrant",
                          "per_block:reentrant+keep_last"});
  }
}
