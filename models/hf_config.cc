#include "models/hf_config.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "engine/error.h"

namespace remat {

namespace {

struct Arch {
  const char* cls;         // architectures[0]
  const char* model_type;  // model_type
  const char* arch;        // ModelConfig::arch
  bool moe;
};

constexpr Arch kArchs[] = {
    {"LlamaForCausalLM", "llama", "llama", false},
    {"Qwen2ForCausalLM", "qwen2", "qwen2", false},
    {"Qwen2MoeForCausalLM", "qwen2_moe", "qwen2_moe", true},
    {"MixtralForCausalLM", "mixtral", "mixtral", true},
};

std::string valid_classes() {
  std::string s;
  for (const Arch& a : kArchs) s += std::string(s.empty() ? "" : ", ") + a.cls;
  return s;
}

// Reads typed keys of one config.json, remembering which it consumed.
class Reader {
 public:
  Reader(const Json& j, std::string what) : j_(j), what_(std::move(what)) {}

  bool has(const char* k) {
    used_.insert(k);
    return j_.has(k) && !j_.at(k).is_null();
  }
  const Json& at(const char* k) {
    used_.insert(k);
    REMAT_CHECK(j_.has(k), Error, what_, ": missing key \"", k, "\"");
    return j_.at(k);
  }
  std::int64_t integer(const char* k) { return checked(k, [&] { return at(k).as_int(); }); }
  std::int64_t integer(const char* k, std::int64_t dflt) { return has(k) ? integer(k) : dflt; }
  double number(const char* k, double dflt) {
    return has(k) ? checked(k, [&] { return at(k).as_number(); }) : dflt;
  }
  bool boolean(const char* k, bool dflt) { return has(k) ? checked(k, [&] { return at(k).as_bool(); }) : dflt; }
  std::string text(const char* k, const std::string& dflt) {
    return has(k) ? checked(k, [&] { return at(k).as_string(); }) : dflt;
  }
  // A key remat cannot honour unless its value is `ok`: an Error naming it.
  template <typename Ok>
  void only_if(const char* k, Ok ok, const std::string& why) {
    if (!j_.has(k)) return;
    used_.insert(k);
    const Json& v = j_.at(k);
    if (!ok(v)) throw Error(what_ + ": \"" + k + "\": " + v.dump() + " is not supported (" + why + ")");
  }
  // The members not consumed.
  std::vector<std::string> rest() const {
    std::vector<std::string> r;
    for (const auto& [k, v] : j_.members())
      if (!used_.count(k)) r.push_back(k);
    return r;
  }
  const std::string& what() const { return what_; }

 private:
  template <typename F>
  auto checked(const char* k, F f) -> decltype(f()) {
    try {
      return f();
    } catch (const Error& e) {
      throw Error(what_ + ": key \"" + k + "\": " + e.what());
    }
  }
  const Json& j_;
  std::string what_;
  std::set<std::string> used_;
};

bool is_null_or_false(const Json& v) { return v.is_null() || (v.type() == Json::Type::boolean && !v.as_bool()); }
bool is_zero(const Json& v) { return v.is_null() || (v.is_number() && v.as_number() == 0); }

// The class: architectures[0] (else model_type), which must agree with model_type.
const Arch& read_arch(Reader& r) {
  const std::string& what = r.what();
  const Arch* arch = nullptr;
  std::string cls;
  if (r.has("architectures")) {
    const Json& a = r.at("architectures");
    REMAT_CHECK(a.is_array() && a.items().size() == 1 && a.items()[0].is_string(), Error, what,
                ": \"architectures\" must list one class, got ", a.dump());
    cls = a.items()[0].as_string();
    for (const Arch& x : kArchs)
      if (cls == x.cls) arch = &x;
    REMAT_CHECK(arch, Error, what, ": architecture ", cls, " is not supported; remat runs ", valid_classes());
  }
  const std::string model_type = r.text("model_type", "");
  if (!arch) {
    for (const Arch& x : kArchs)
      if (model_type == x.model_type) arch = &x;
    REMAT_CHECK(arch, Error, what, ": no \"architectures\" and model_type \"", model_type,
                "\" is not one remat runs (", valid_classes(), ")");
  }
  REMAT_CHECK(model_type.empty() || model_type == arch->model_type, Error, what, ": model_type \"", model_type,
              "\" does not match architecture ", arch->cls, " (\"", arch->model_type, "\")");
  return *arch;
}

// Sizes, heads, norm and init (absent keys take the HF config class's
// defaults, which differ by class); no dropout, no z-loss.
void read_dims(Reader& r, const std::string& a, ModelConfig& c) {
  c.vocab = r.integer("vocab_size");
  c.d_model = r.integer("hidden_size");
  c.ffn = r.integer("intermediate_size");
  c.n_layers = r.integer("num_hidden_layers");
  c.n_heads = r.integer("num_attention_heads");
  const bool mixtral = a == "mixtral";
  const std::int64_t kv_default = mixtral ? 8 : a == "qwen2" ? 32 : a == "qwen2_moe" ? 16 : c.n_heads;
  c.kv_heads = r.integer("num_key_value_heads", kv_default);
  if (c.kv_heads == c.n_heads) c.kv_heads = 0;
  c.head_size = r.integer("head_dim", 0);
  if (c.head_size > 0 && c.n_heads > 0 && c.head_size * c.n_heads == c.d_model) c.head_size = 0;
  c.norm_eps = r.number("rms_norm_eps", mixtral ? 1e-5 : 1e-6);
  c.init_std = r.number("initializer_range", 0.02);
  c.tie_embeddings = r.boolean("tie_word_embeddings", false);
  c.dropout = 0;
  c.z_coef = 0;
}

// RoPE: rope_theta, or transformers 5's rope_parameters with the default type.
void read_rope(Reader& r, const std::string& a, ModelConfig& c) {
  c.rope_theta = r.number("rope_theta", a == "mixtral" ? 1e6 : 10000.0);
  r.only_if("rope_parameters", [&](const Json& v) {
    if (v.is_null()) return true;
    if (!v.is_object()) return false;
    for (const auto& [k, x] : v.members()) {
      if (k == "rope_theta" && x.is_number()) c.rope_theta = x.as_number();
      else if (k == "rope_type" && x.is_string() && x.as_string() == "default") continue;
      else if (k == "partial_rotary_factor" && x.is_number() && x.as_number() == 1.0) continue;
      else if (k != "rope_theta") return false;
    }
    return true;
  }, "only the default rotary embedding (rope_type \"default\") is implemented");
}

// Keys whose other values change the math in ways remat does not implement.
void reject_unsupported(Reader& r, const std::string& a) {
  r.only_if("rope_scaling", [](const Json& v) { return v.is_null(); },
            "scaled rotary embeddings are not implemented; remat uses plain RoPE");
  r.only_if("partial_rotary_factor", [](const Json& v) { return v.is_number() && v.as_number() == 1.0; },
            "remat rotates the whole head");
  r.only_if("hidden_act", [](const Json& v) { return v.is_string() && v.as_string() == "silu"; },
            "remat's MLPs are SwiGLU (silu)");
  r.only_if("mlp_bias", is_null_or_false, "remat's MLP projections have no bias");
  r.only_if("attention_dropout", is_zero, "remat has no dropout inside attention");
  r.only_if("router_jitter_noise", is_zero, "remat's router adds no jitter");
  r.only_if("use_sliding_window", is_null_or_false, "remat's attention is full causal, no sliding window");
  if (a == "llama" || a == "mixtral")
    r.only_if("sliding_window", [](const Json& v) { return v.is_null(); },
              "remat's attention is full causal, no sliding window");
}

// Biases: Llama's attention_bias covers q, k, v and o; Qwen2 and Qwen2-MoE
// always have q/k/v biases and none on o.
void read_biases(Reader& r, const std::string& a, ModelConfig& c) {
  if (a == "llama") c.qkv_bias = c.o_bias = r.boolean("attention_bias", false);
  if (a == "qwen2" || a == "qwen2_moe") c.qkv_bias = true;
  if (a == "mixtral") r.only_if("attention_bias", is_null_or_false, "Mixtral's attention has no biases");
}

// The experts of Qwen2-MoE and Mixtral; for dense classes the MoE keys are
// only read, so they count as understood.
void read_moe(Reader& r, const Arch& arch, ModelConfig& c) {
  const std::string a = arch.arch;
  if (a == "qwen2_moe") {
    c.experts = r.integer("num_experts", 60);
    if (c.experts > 0) {
      c.top_k = r.integer("num_experts_per_tok", 4);
      c.moe_ffn = r.integer("moe_intermediate_size", 1408);
      c.shared_ffn = r.integer("shared_expert_intermediate_size", 5632);
      c.shared_gate = c.shared_ffn > 0;
      c.norm_topk = r.boolean("norm_topk_prob", false);
      c.sparse_step = r.integer("decoder_sparse_step", 1);
      if (r.has("mlp_only_layers")) {
        const Json& l = r.at("mlp_only_layers");
        REMAT_CHECK(l.is_array(), Error, r.what(), ": \"mlp_only_layers\" must be an array, got ", l.dump());
        for (const Json& x : l.items()) c.dense_layers.push_back(x.as_int());
      }
      c.aux_coef = r.number("router_aux_loss_coef", 0.001);
    }
  } else if (a == "mixtral") {
    c.experts = r.integer("num_local_experts", 8);
    REMAT_CHECK(c.experts >= 1, Error, r.what(), ": \"num_local_experts\": ", c.experts,
                " is not supported (a Mixtral routes every block through its experts: at least 1)");
    c.top_k = r.integer("num_experts_per_tok", 2);
    c.moe_ffn = c.ffn;
    c.norm_topk = true;
    c.aux_coef = r.number("router_aux_loss_coef", 0.001);
  }
  for (const char* k : {"output_router_logits", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                        "shared_expert_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
                        "mlp_only_layers", "router_aux_loss_coef", "num_local_experts"})
    if (!arch.moe) r.has(k);
}

}  // namespace

HfConfig config_from_hf(const Json& j, const std::string& what) {
  REMAT_CHECK(j.is_object(), Error, what, ": expected a JSON object");
  Reader r(j, what);
  const Arch& arch = read_arch(r);
  const std::string a = arch.arch;
  ModelConfig c;
  c.name = a;
  c.arch = a;
  read_dims(r, a, c);
  read_rope(r, a, c);
  reject_unsupported(r, a);
  read_biases(r, a, c);
  read_moe(r, arch, c);

  // Everything not read above is kept for export, and named for a note
  // (max_position_embeddings and friends are harmless: kept, not modelled).
  HfConfig out;
  Json extra = Json::object();
  for (const std::string& k : r.rest()) {
    extra.set(k, j.at(k));
    out.passed_through.push_back(k);
  }
  c.hf_extra = extra.dump();
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(what + ": " + e.what());
  }
  out.config = c;
  return out;
}

Json config_to_hf(const ModelConfig& c, const std::string& dtype_name) {
  std::string a = c.arch;
  if (a.empty()) {
    REMAT_CHECK(c.experts == 0, Error,
                "export: remat's own MoE decoder (config '", c.name,
                "') has no Hugging Face class; export takes dense models and models loaded with --model");
    a = "llama";
  }
  const Arch* arch = nullptr;
  for (const Arch& x : kArchs)
    if (a == x.arch) arch = &x;
  REMAT_CHECK(arch, Error, "export: unknown architecture '", a, "'");
  Json j = c.hf_extra.empty() ? Json::object() : Json::parse(c.hf_extra, "hf_extra");
  auto num = [](double v) { return Json::number(v); };
  j.set("architectures", Json::array({Json::string(arch->cls)}));
  j.set("model_type", Json::string(arch->model_type));
  j.set("vocab_size", num(double(c.vocab)));
  j.set("hidden_size", num(double(c.d_model)));
  j.set("intermediate_size", num(double(a == "mixtral" ? c.moe_ffn : c.ffn)));
  j.set("num_hidden_layers", num(double(c.n_layers)));
  j.set("num_attention_heads", num(double(c.n_heads)));
  j.set("num_key_value_heads", num(double(c.num_kv_heads())));
  j.set("head_dim", num(double(c.head_dim())));
  j.set("rms_norm_eps", num(c.norm_eps));
  j.set("rope_theta", num(c.rope_theta));
  j.set("tie_word_embeddings", Json::boolean(c.tie_embeddings));
  j.set("hidden_act", Json::string("silu"));
  j.set("initializer_range", num(c.init_std));
  j.set(j.has("dtype") ? "dtype" : "torch_dtype", Json::string(dtype_name));
  if (!j.has("max_position_embeddings")) j.set("max_position_embeddings", num(double(std::max<std::int64_t>(c.seq, 2048))));
  if (a == "llama") {
    REMAT_CHECK(c.qkv_bias == c.o_bias, Error,
                "export: Llama's attention_bias covers q, k, v and o together; this model has q/k/v biases ",
                c.qkv_bias ? "on" : "off", " and an o bias ", c.o_bias ? "on" : "off");
    j.set("attention_bias", Json::boolean(c.qkv_bias));
    j.set("mlp_bias", Json::boolean(false));
  } else {
    REMAT_CHECK(c.qkv_bias == (a != "mixtral") && !c.o_bias, Error, "export: ", arch->cls,
                " fixes its attention biases (q/k/v ", a != "mixtral" ? "on" : "off",
                ", o off); this model differs");
  }
  if (a == "qwen2_moe") {
    j.set("num_experts", num(double(c.experts)));
    j.set("num_experts_per_tok", num(double(c.top_k)));
    j.set("moe_intermediate_size", num(double(c.moe_ffn)));
    REMAT_CHECK(c.shared_hidden() == 0 || c.shared_gate, Error,
                "export: Qwen2-MoE gates its shared expert; this model's shared expert has no gate");
    j.set("shared_expert_intermediate_size", num(double(c.shared_hidden())));
    j.set("norm_topk_prob", Json::boolean(c.norm_topk));
    j.set("decoder_sparse_step", num(double(c.sparse_step)));
    Json only = Json::array();
    for (std::int64_t l = 0; l < c.n_layers; ++l)
      if (l < c.dense_first || std::find(c.dense_layers.begin(), c.dense_layers.end(), l) != c.dense_layers.end())
        only.push(num(double(l)));
    j.set("mlp_only_layers", only);
    j.set("router_aux_loss_coef", num(c.aux_coef));
  } else if (a == "mixtral") {
    REMAT_CHECK(c.experts > 0 && c.moe_ffn == c.ffn && c.shared_hidden() == 0 && c.norm_topk &&
                    c.dense_first == 0 && c.dense_layers.empty() && c.sparse_step == 1,
                Error, "export: this model is not a Mixtral (every block routed, no shared expert, "
                       "renormalised top-K, expert size = intermediate_size)");
    j.set("num_local_experts", num(double(c.experts)));
    j.set("num_experts_per_tok", num(double(c.top_k)));
    j.set("router_aux_loss_coef", num(c.aux_coef));
  } else {
    REMAT_CHECK(c.experts == 0, Error, "export: ", arch->cls, " has no experts");
  }
  return j;
}

}  // namespace remat
