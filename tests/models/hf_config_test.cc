// Hugging Face config.json <-> ModelConfig (models/hf_config.h), and the
// parameter names and shapes each architecture's model then has.
#include <catch2/catch.hpp>

#include <map>
#include <set>

#include "engine/error.h"
#include "models/decoder.h"
#include "models/hf_config.h"

using namespace remat;

namespace {

Json parse(const std::string& text) { return Json::parse(text, "test config.json"); }

// A config.json of `arch` with small sizes, with `extra` members (JSON text
// without braces) added or replacing the base ones.
std::string config_text(const std::string& cls, const std::string& type, const std::string& extra = "") {
  Json j = parse(R"({"architectures": [")" + cls + R"("], "model_type": ")" + type + R"(",
    "vocab_size": 320, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 500000.0,
    "hidden_act": "silu", "max_position_embeddings": 4096, "bos_token_id": 1, "eos_token_id": 2,
    "torch_dtype": "bfloat16", "transformers_version": "4.45.0", "use_cache": true, "rope_scaling": null})");
  const Json more = parse("{" + extra + "}");
  for (const auto& [k, v] : more.members()) j.set(k, v);
  return j.dump();
}

std::map<std::string, Shape> shapes_of(const ModelConfig& c) {
  DecoderModel m(c, 0);
  std::map<std::string, Shape> s;
  for (const auto& [n, p] : m.named_parameters()) s[n] = p.sizes();
  return s;
}

}  // namespace

TEST_CASE("hf config: Llama with GQA, head_dim, tied embeddings and attention biases", "[models][hf]") {
  const HfConfig h = config_from_hf(parse(config_text(
      "LlamaForCausalLM", "llama", R"("head_dim": 24, "tie_word_embeddings": true, "attention_bias": true)")));
  const ModelConfig& c = h.config;
  CHECK(c.arch == "llama");
  CHECK(c.vocab == 320);
  CHECK(c.d_model == 64);
  CHECK(c.ffn == 96);
  CHECK(c.n_layers == 3);
  CHECK(c.n_heads == 4);
  CHECK(c.num_kv_heads() == 2);
  CHECK(c.head_dim() == 24);
  CHECK(c.norm_eps == 1e-6);
  CHECK(c.rope_theta == 500000.0);
  CHECK(c.tie_embeddings);
  CHECK(c.qkv_bias);
  CHECK(c.o_bias);
  CHECK(c.experts == 0);
  // Harmless keys are kept for export, and named.
  const std::set<std::string> passed(h.passed_through.begin(), h.passed_through.end());
  CHECK(passed == std::set<std::string>{"bos_token_id", "eos_token_id", "max_position_embeddings", "torch_dtype",
                                        "transformers_version", "use_cache"});
  const auto s = shapes_of(c);
  CHECK(s.count("lm_head.weight") == 0);  // tied: one parameter, model.embed_tokens.weight
  CHECK(s.at("model.embed_tokens.weight") == Shape{320, 64});
  CHECK(s.at("model.layers.0.self_attn.q_proj.weight") == Shape{96, 64});
  CHECK(s.at("model.layers.0.self_attn.k_proj.weight") == Shape{48, 64});
  CHECK(s.at("model.layers.0.self_attn.v_proj.bias") == Shape{48});
  CHECK(s.at("model.layers.0.self_attn.o_proj.weight") == Shape{64, 96});
  CHECK(s.at("model.layers.0.self_attn.o_proj.bias") == Shape{64});
  CHECK(s.size() == 1 + 1 + 3 * (2 + 4 + 4 + 3));
}

TEST_CASE("hf config: Qwen2 has q/k/v biases and no o bias", "[models][hf]") {
  const ModelConfig c =
      config_from_hf(parse(config_text("Qwen2ForCausalLM", "qwen2", R"("use_sliding_window": false, "sliding_window": 4096, "max_window_layers": 21)")))
          .config;
  CHECK(c.arch == "qwen2");
  CHECK(c.qkv_bias);
  CHECK_FALSE(c.o_bias);
  CHECK_FALSE(c.tie_embeddings);
  const auto s = shapes_of(c);
  CHECK(s.count("model.layers.2.self_attn.q_proj.bias") == 1);
  CHECK(s.count("model.layers.2.self_attn.o_proj.bias") == 0);
  CHECK(s.count("lm_head.weight") == 1);
}

TEST_CASE("hf config: Qwen2-MoE's experts, gated shared expert, raw top-K and dense layers", "[models][hf]") {
  const ModelConfig c = config_from_hf(parse(config_text("Qwen2MoeForCausalLM", "qwen2_moe", R"(
      "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
      "shared_expert_intermediate_size": 48, "norm_topk_prob": false, "decoder_sparse_step": 1,
      "mlp_only_layers": [1], "router_aux_loss_coef": 0.02, "output_router_logits": false)")))
                            .config;
  CHECK(c.experts == 6);
  CHECK(c.top_k == 2);
  CHECK(c.moe_ffn == 32);
  CHECK(c.shared_hidden() == 48);
  CHECK(c.shared_gate);
  CHECK_FALSE(c.norm_topk);
  CHECK(c.aux_coef == 0.02);
  CHECK(c.is_moe_layer(0));
  CHECK_FALSE(c.is_moe_layer(1));
  CHECK(c.is_moe_layer(2));
  const auto s = shapes_of(c);
  CHECK(s.at("model.layers.0.mlp.gate.weight") == Shape{6, 64});
  CHECK(s.at("model.layers.0.mlp.experts.5.down_proj.weight") == Shape{64, 32});
  CHECK(s.at("model.layers.0.mlp.shared_expert.up_proj.weight") == Shape{48, 64});
  CHECK(s.at("model.layers.0.mlp.shared_expert_gate.weight") == Shape{1, 64});
  CHECK(s.at("model.layers.1.mlp.up_proj.weight") == Shape{96, 64});  // the dense layer: intermediate_size
  // decoder_sparse_step 2: layers 1, 3, ... are sparse.
  const ModelConfig step = config_from_hf(parse(config_text("Qwen2MoeForCausalLM", "qwen2_moe", R"(
      "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
      "shared_expert_intermediate_size": 0, "decoder_sparse_step": 2)")))
                               .config;
  CHECK_FALSE(step.is_moe_layer(0));
  CHECK(step.is_moe_layer(1));
  CHECK_FALSE(step.is_moe_layer(2));
  CHECK(step.shared_hidden() == 0);
  CHECK_FALSE(step.shared_gate);
  CHECK(step.aux_coef == 0.001);  // HF's default when the key is absent
}

TEST_CASE("hf config: Mixtral's block_sparse_moe names", "[models][hf]") {
  const ModelConfig c = config_from_hf(parse(config_text("MixtralForCausalLM", "mixtral", R"(
      "num_local_experts": 4, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02, "sliding_window": null,
      "router_jitter_noise": 0.0)")))
                            .config;
  CHECK(c.experts == 4);
  CHECK(c.moe_ffn == 96);
  CHECK(c.norm_topk);
  const auto s = shapes_of(c);
  CHECK(s.at("model.layers.1.block_sparse_moe.gate.weight") == Shape{4, 64});
  CHECK(s.at("model.layers.1.block_sparse_moe.experts.3.w1.weight") == Shape{96, 64});
  CHECK(s.at("model.layers.1.block_sparse_moe.experts.3.w3.weight") == Shape{96, 64});
  CHECK(s.at("model.layers.1.block_sparse_moe.experts.3.w2.weight") == Shape{64, 96});
  CHECK(s.count("model.layers.1.mlp.gate.weight") == 0);
}

TEST_CASE("hf config: absent optional keys take each HF class's defaults", "[models][hf]") {
  const std::string base = R"("vocab_size": 320, "hidden_size": 256, "intermediate_size": 96,
      "num_hidden_layers": 2, "num_attention_heads": 32)";
  const ModelConfig mix = config_from_hf(parse(R"({"architectures": ["MixtralForCausalLM"], )" + base + "}")).config;
  CHECK(mix.norm_eps == 1e-5);
  CHECK(mix.rope_theta == 1e6);
  CHECK(mix.num_kv_heads() == 8);
  CHECK(mix.experts == 8);
  CHECK(mix.top_k == 2);
  const ModelConfig llama = config_from_hf(parse(R"({"architectures": ["LlamaForCausalLM"], )" + base + "}")).config;
  CHECK(llama.norm_eps == 1e-6);
  CHECK(llama.rope_theta == 10000.0);
  CHECK(llama.num_kv_heads() == 32);
  CHECK(config_from_hf(parse(R"({"architectures": ["Qwen2ForCausalLM"], )" + base + "}")).config.num_kv_heads() == 32);
  CHECK(config_from_hf(parse(R"({"architectures": ["Qwen2MoeForCausalLM"], "num_experts": 4, "num_experts_per_tok": 2,
      "moe_intermediate_size": 8, )" + base + "}")).config.num_kv_heads() == 16);
}

TEST_CASE("hf config: export writes a config.json that reads back to the same model", "[models][hf]") {
  for (const std::string& text :
       {config_text("LlamaForCausalLM", "llama", R"("head_dim": 24, "tie_word_embeddings": true)"),
        config_text("Qwen2ForCausalLM", "qwen2"),
        config_text("Qwen2MoeForCausalLM", "qwen2_moe", R"("num_experts": 6, "num_experts_per_tok": 2,
            "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48, "mlp_only_layers": [1])"),
        config_text("MixtralForCausalLM", "mixtral", R"("num_local_experts": 4, "num_experts_per_tok": 2)")}) {
    const ModelConfig c = config_from_hf(parse(text)).config;
    INFO(c.arch);
    const Json out = config_to_hf(c, "bfloat16");
    CHECK(out.at("torch_dtype").as_string() == "bfloat16");
    CHECK(out.at("max_position_embeddings").as_int() == 4096);  // kept from the source
    CHECK(out.at("eos_token_id").as_int() == 2);
    const ModelConfig back = config_from_hf(Json::parse(out.dump())).config;
    CHECK(back.to_json().dump() == c.to_json().dump());
  }
  // remat's own dense decoder exports as Llama; its MoE decoder has no HF class.
  CHECK(config_to_hf(ModelConfig::named("tiny"), "float32").at("architectures").items()[0].as_string() ==
        "LlamaForCausalLM");
  CHECK_THROWS_WITH(config_to_hf(ModelConfig::named("tiny-moe"), "float32"),
                    Catch::Contains("remat's own MoE decoder (config 'tiny-moe') has no Hugging Face class"));
  // The architecture keys survive remat's own config JSON (training states).
  const ModelConfig q = config_from_hf(parse(config_text("Qwen2MoeForCausalLM", "qwen2_moe",
      R"("num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "mlp_only_layers": [0, 2])"))).config;
  CHECK(ModelConfig::from_json(Json::parse(q.to_json().dump())).to_json().dump() == q.to_json().dump());
}

TEST_CASE("hf config: settings remat does not implement are errors naming the key", "[models][hf]") {
  auto fails = [](const std::string& cls, const std::string& type, const std::string& extra, const std::string& why) {
    INFO(extra);
    CHECK_THROWS_WITH(config_from_hf(parse(config_text(cls, type, extra))), Catch::Contains(why));
  };
  fails("LlamaForCausalLM", "llama", R"("rope_scaling": {"type": "linear", "factor": 2.0})", "\"rope_scaling\"");
  fails("LlamaForCausalLM", "llama", R"("hidden_act": "gelu")", "\"hidden_act\": \"gelu\" is not supported");
  fails("LlamaForCausalLM", "llama", R"("mlp_bias": true)", "\"mlp_bias\"");
  fails("LlamaForCausalLM", "llama", R"("attention_dropout": 0.1)", "\"attention_dropout\"");
  fails("MixtralForCausalLM", "mixtral", R"("sliding_window": 4096)", "\"sliding_window\": 4096 is not supported");
  fails("MixtralForCausalLM", "mixtral", R"("router_jitter_noise": 0.1)", "\"router_jitter_noise\"");
  fails("Qwen2ForCausalLM", "qwen2", R"("use_sliding_window": true)", "\"use_sliding_window\"");
  fails("LlamaForCausalLM", "llama", R"("rope_parameters": {"rope_type": "yarn", "factor": 4.0})", "\"rope_parameters\"");
  fails("LlamaForCausalLM", "llama", R"("partial_rotary_factor": 0.5)", "\"partial_rotary_factor\"");
  fails("GPT2LMHeadModel", "llama", "", "architecture GPT2LMHeadModel is not supported; remat runs LlamaForCausalLM");
  fails("LlamaForCausalLM", "qwen2", "", "model_type \"qwen2\" does not match architecture LlamaForCausalLM");
  fails("LlamaForCausalLM", "llama", R"("num_key_value_heads": 3)", "kv_heads must divide n_heads");
  CHECK_THROWS_WITH(config_from_hf(parse(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 10})")),
                    Catch::Contains("missing key \"hidden_size\""));
  fails("LlamaForCausalLM", "llama", R"("vocab_size": "x")", "key \"vocab_size\"");
  // transformers 5's default rope_parameters carry the theta.
  CHECK(config_from_hf(parse(config_text("LlamaForCausalLM", "llama",
                                         R"("rope_parameters": {"rope_type": "default", "rope_theta": 1000.0})")))
            .config.rope_theta == 1000.0);
}
