#include "models/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "engine/error.h"

namespace remat {

namespace {
ModelConfig make(const char* name, std::int64_t vocab, std::int64_t d, std::int64_t layers,
                 std::int64_t heads, std::int64_t ffn, std::int64_t seq, std::int64_t batch,
                 std::int64_t experts = 0, std::int64_t top_k = 0, std::int64_t moe_ffn = 0,
                 std::int64_t shared = 0, std::int64_t dense_first = 0) {
  ModelConfig c;
  c.name = name;
  c.vocab = vocab;
  c.d_model = d;
  c.n_layers = layers;
  c.n_heads = heads;
  c.ffn = ffn;
  c.seq = seq;
  c.batch = batch;
  c.experts = experts;
  c.top_k = top_k;
  c.moe_ffn = moe_ffn;
  c.shared = shared;
  c.dense_first = dense_first;
  return c;
}

// Meta-Llama-3-8B / -70B: vocabulary 128256, 8 key/value heads, rope theta
// 500000, RMSNorm eps 1e-5, untied head; a step of 8192 tokens.
ModelConfig llama3(const char* name, std::int64_t d, std::int64_t layers, std::int64_t heads, std::int64_t ffn) {
  ModelConfig c = make(name, 128256, d, layers, heads, ffn, 8192, 1);
  c.arch = "llama";
  c.kv_heads = 8;
  c.rope_theta = 500000;
  c.norm_eps = 1e-5;
  return c;
}

// Llama-2-7b: vocabulary 32000, 32 blocks of d 4096, 32 heads (no grouped
// key/values), MLP 11008, rope theta 10000, RMSNorm eps 1e-5, 4096 tokens.
ModelConfig llama2_7b() {
  ModelConfig c = make("llama2-7b", 32000, 4096, 32, 32, 11008, 4096, 1);
  c.arch = "llama";
  c.kv_heads = 32;
  c.rope_theta = 10000;
  c.norm_eps = 1e-5;
  return c;
}

// Mixtral-8x7B-v0.1: 8 experts of 14336, top-2, every block sparse,
// vocabulary 32000, 8 key/value heads, rope theta 1e6.
ModelConfig mixtral_8x7b() {
  ModelConfig c = make("mixtral-8x7b", 32000, 4096, 32, 32, 14336, 4096, 1, 8, 2, 14336);
  c.arch = "mixtral";
  c.kv_heads = 8;
  c.rope_theta = 1e6;
  c.norm_eps = 1e-5;
  return c;
}

// Qwen2-57B-A14B (Qwen2-MoE): 64 experts of 2560, top-8 unnormalised, a
// gated shared expert of 20480, q/k/v biases, 4 key/value heads.
ModelConfig qwen2_57b_a14b() {
  ModelConfig c = make("qwen2-moe-57b", 151936, 3584, 28, 28, 18944, 4096, 1, 64, 8, 2560);
  c.arch = "qwen2_moe";
  c.kv_heads = 4;
  c.qkv_bias = true;
  c.shared_ffn = 20480;
  c.shared_gate = true;
  c.norm_topk = false;
  c.rope_theta = 1e6;
  c.norm_eps = 1e-6;
  c.aux_coef = 0.001;
  return c;
}

// docs/REFERENCE.md#models-and-configs.
const std::vector<ModelConfig>& registry() {
  static const std::vector<ModelConfig> r = {
      make("tiny", 256, 128, 4, 4, 344, 128, 8),
      make("tiny-moe", 256, 128, 4, 4, 344, 128, 8, 8, 2, 128, 1, 1),
      make("bench-dense", 256, 512, 8, 8, 1376, 256, 4),
      make("bench-moe", 256, 256, 4, 4, 688, 256, 4, 8, 2, 256, 1, 1),
      // A modern vocabulary (Qwen 3's) on a small body: the loss's logits
      // outweigh every block's activations (the chunked loss, #35).
      make("bench-vocab", 151669, 256, 4, 4, 688, 512, 4),
      // Published shapes, for --device meta (docs/META.md): sizes from each
      // model's Hugging Face config.json; seq and batch are a training step's.
      llama3("llama3-8b", 4096, 32, 32, 14336),
      llama3("llama3-70b", 8192, 80, 64, 28672),
      llama2_7b(),
      mixtral_8x7b(),
      qwen2_57b_a14b(),
  };
  return r;
}

const char* kKeys[] = {"name",   "vocab",   "d_model",  "n_layers",    "n_heads",  "ffn",
                       "seq",    "batch",   "experts",  "top_k",       "moe_ffn",  "shared",
                       "dense_first", "dropout", "rope_theta", "norm_eps", "init_std", "aux_coef",
                       "z_coef", "capacity_factor", "random_routing", "balanced_routing",
                       // Hugging Face architectures (left out of to_json at their defaults)
                       "arch", "kv_heads", "head_size", "tie_embeddings", "qkv_bias", "o_bias", "shared_ffn",
                       "shared_gate", "norm_topk", "sparse_step", "dense_layers", "hf_extra",
                       // fine-tuning (left out when unset)
                       "lora", "freeze"};

const char* kArchs[] = {"", "llama", "qwen2", "qwen2_moe", "mixtral"};
}  // namespace

bool ModelConfig::is_moe_layer(std::int64_t i) const {
  if (experts <= 0 || i < dense_first) return false;
  if (sparse_step > 1 && (i + 1) % sparse_step != 0) return false;
  return std::find(dense_layers.begin(), dense_layers.end(), i) == dense_layers.end();
}

std::vector<std::string> ModelConfig::names() {
  std::vector<std::string> n;
  for (const auto& c : registry()) n.push_back(c.name);
  return n;
}

ModelConfig ModelConfig::named(const std::string& name) {
  for (const auto& c : registry())
    if (c.name == name) return c;
  std::string valid;
  for (const auto& n : names()) valid += (valid.empty() ? "" : ", ") + n;
  throw Error("unknown config '" + name + "'; valid configs are " + valid +
              ", or a path to a .json file");
}

void ModelConfig::validate() const {
  std::vector<std::string> bad;
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) bad.push_back(what);
  };
  need(vocab > 0, "vocab must be > 0");
  need(d_model > 0, "d_model must be > 0");
  need(n_layers > 0, "n_layers must be > 0");
  need(head_size >= 0, "head_size must be >= 0 (0: d_model / n_heads)");
  need(n_heads > 0 && (head_size > 0 || d_model % n_heads == 0),
       "n_heads must divide d_model (or head_size must be given)");
  need(n_heads > 0 && (head_size > 0 ? head_size : d_model / std::max<std::int64_t>(n_heads, 1)) % 2 == 0,
       "head dim (head_size, or d_model / n_heads) must be even for rotary embeddings");
  need(kv_heads >= 0 && (kv_heads == 0 || (n_heads > 0 && n_heads % kv_heads == 0)),
       "kv_heads must divide n_heads (0: n_heads)");
  need(std::find(std::begin(kArchs), std::end(kArchs), arch) != std::end(kArchs),
       "arch must be one of \"\" (remat), llama, qwen2, qwen2_moe, mixtral; got \"" + arch + "\"");
  need(ffn > 0, "ffn must be > 0");
  need(!(random_routing && balanced_routing), "random_routing and balanced_routing exclude each other");
  need(seq > 0 && batch > 0, "seq and batch must be > 0");
  need(dropout >= 0 && dropout < 1, "dropout must be in [0, 1)");
  // Finite too: a config is saved with its state as JSON, which has no inf.
  auto finite_at_least = [&](double v, bool positive, const char* what) {
    if (std::isfinite(v) && (positive ? v > 0 : v >= 0)) return;
    std::ostringstream os;
    os << what << " must be finite and " << (positive ? "> 0" : ">= 0") << ", got " << v;
    bad.push_back(os.str());
  };
  finite_at_least(rope_theta, true, "rope_theta");
  finite_at_least(norm_eps, false, "norm_eps");
  finite_at_least(init_std, false, "init_std");
  finite_at_least(aux_coef, false, "aux_coef");
  finite_at_least(z_coef, false, "z_coef");
  need(experts >= 0, "experts must be >= 0");
  if (experts > 0) {
    need(top_k >= 1 && top_k <= experts, "top_k must be in [1, experts]");
    need(moe_ffn > 0, "moe_ffn must be > 0");
    need(shared >= 0, "shared must be >= 0");
    need(shared_ffn >= 0, "shared_ffn must be >= 0");
    need(!shared_gate || shared_hidden() > 0, "shared_gate needs a shared expert (shared or shared_ffn)");
    need(sparse_step >= 1, "sparse_step must be >= 1");
    for (std::int64_t l : dense_layers)
      need(l >= 0 && l < n_layers, "dense_layers entries must be in [0, n_layers), got " + std::to_string(l));
    need(dense_first >= 0 && dense_first <= n_layers, "dense_first must be in [0, n_layers]");
    need(std::isfinite(capacity_factor) && capacity_factor >= 0,
         "capacity_factor must be finite and >= 0 (0: dropless)");
  }
  if (!bad.empty()) {
    std::string msg = "invalid config '" + name + "':";
    for (const auto& b : bad) msg += "\n  " + b;
    throw Error(msg);
  }
}

Json ModelConfig::to_json() const {
  Json j = Json::object();
  j.set("name", Json::string(name));
  j.set("vocab", Json::number(double(vocab)));
  j.set("d_model", Json::number(double(d_model)));
  j.set("n_layers", Json::number(double(n_layers)));
  j.set("n_heads", Json::number(double(n_heads)));
  j.set("ffn", Json::number(double(ffn)));
  j.set("seq", Json::number(double(seq)));
  j.set("batch", Json::number(double(batch)));
  j.set("experts", Json::number(double(experts)));
  j.set("top_k", Json::number(double(top_k)));
  j.set("moe_ffn", Json::number(double(moe_ffn)));
  j.set("shared", Json::number(double(shared)));
  j.set("dense_first", Json::number(double(dense_first)));
  j.set("dropout", Json::number(dropout));
  j.set("rope_theta", Json::number(rope_theta));
  j.set("norm_eps", Json::number(norm_eps));
  j.set("init_std", Json::number(init_std));
  j.set("aux_coef", Json::number(aux_coef));
  j.set("z_coef", Json::number(z_coef));
  j.set("capacity_factor", Json::number(capacity_factor));
  j.set("random_routing", Json::boolean(random_routing));
  // The architecture keys only where they differ from remat's decoder, so
  // its configs (and the states and dumps that record them) read as before.
  const ModelConfig d;
  if (arch != d.arch) j.set("arch", Json::string(arch));
  if (kv_heads != d.kv_heads) j.set("kv_heads", Json::number(double(kv_heads)));
  if (head_size != d.head_size) j.set("head_size", Json::number(double(head_size)));
  if (tie_embeddings != d.tie_embeddings) j.set("tie_embeddings", Json::boolean(tie_embeddings));
  if (qkv_bias != d.qkv_bias) j.set("qkv_bias", Json::boolean(qkv_bias));
  if (o_bias != d.o_bias) j.set("o_bias", Json::boolean(o_bias));
  if (shared_ffn != d.shared_ffn) j.set("shared_ffn", Json::number(double(shared_ffn)));
  if (shared_gate != d.shared_gate) j.set("shared_gate", Json::boolean(shared_gate));
  if (norm_topk != d.norm_topk) j.set("norm_topk", Json::boolean(norm_topk));
  if (sparse_step != d.sparse_step) j.set("sparse_step", Json::number(double(sparse_step)));
  if (dense_layers != d.dense_layers) {
    Json a = Json::array();
    for (std::int64_t l : dense_layers) a.push(Json::number(double(l)));
    j.set("dense_layers", a);
  }
  if (hf_extra != d.hf_extra) j.set("hf_extra", Json::string(hf_extra));
  if (balanced_routing) j.set("balanced_routing", Json::boolean(true));
  if (lora.enabled()) j.set("lora", Json::string(lora.str()));
  if (!freeze.empty()) {
    Json a = Json::array();
    for (const std::string& p : freeze) a.push(Json::string(p));
    j.set("freeze", a);
  }
  return j;
}

namespace {
void read_fine_tuning(const Json& j, ModelConfig& c) {
  if (j.has("lora")) c.lora = LoraConfig::parse(j.at("lora").as_string());
  if (j.has("freeze")) {
    c.freeze.clear();
    for (const Json& p : j.at("freeze").items()) c.freeze.push_back(p.as_string());
  }
}
}  // namespace

ModelConfig ModelConfig::from_json(const Json& j) {
  REMAT_CHECK(j.is_object(), Error, "config: expected a JSON object");
  ModelConfig c;
  if (j.has("name") && j.at("name").is_string()) {
    // Start from the named config when the name is a known one.
    for (const auto& r : registry())
      if (r.name == j.at("name").as_string()) c = r;
    c.name = j.at("name").as_string();
  }
  for (const auto& [key, value] : j.members()) {
    bool known = false;
    for (const char* k : kKeys) known = known || key == k;
    if (!known) {
      std::string valid;
      for (const char* k : kKeys) valid += std::string(valid.empty() ? "" : ", ") + k;
      throw Error("config: unknown key \"" + key + "\"; valid keys are " + valid);
    }
  }
  auto geti = [&](const char* k, std::int64_t& v) {
    if (j.has(k)) v = j.at(k).as_int();
  };
  auto getd = [&](const char* k, double& v) {
    if (j.has(k)) v = j.at(k).as_number();
  };
  geti("vocab", c.vocab);
  geti("d_model", c.d_model);
  geti("n_layers", c.n_layers);
  geti("n_heads", c.n_heads);
  geti("ffn", c.ffn);
  geti("seq", c.seq);
  geti("batch", c.batch);
  geti("experts", c.experts);
  geti("top_k", c.top_k);
  geti("moe_ffn", c.moe_ffn);
  geti("shared", c.shared);
  geti("dense_first", c.dense_first);
  getd("dropout", c.dropout);
  getd("rope_theta", c.rope_theta);
  getd("norm_eps", c.norm_eps);
  getd("init_std", c.init_std);
  getd("aux_coef", c.aux_coef);
  getd("z_coef", c.z_coef);
  getd("capacity_factor", c.capacity_factor);
  if (j.has("random_routing")) c.random_routing = j.at("random_routing").as_bool();
  if (j.has("balanced_routing")) c.balanced_routing = j.at("balanced_routing").as_bool();
  auto getb = [&](const char* k, bool& v) {
    if (j.has(k)) v = j.at(k).as_bool();
  };
  if (j.has("arch")) c.arch = j.at("arch").as_string();
  geti("kv_heads", c.kv_heads);
  geti("head_size", c.head_size);
  getb("tie_embeddings", c.tie_embeddings);
  getb("qkv_bias", c.qkv_bias);
  getb("o_bias", c.o_bias);
  geti("shared_ffn", c.shared_ffn);
  getb("shared_gate", c.shared_gate);
  getb("norm_topk", c.norm_topk);
  geti("sparse_step", c.sparse_step);
  if (j.has("dense_layers")) {
    c.dense_layers.clear();
    for (const Json& l : j.at("dense_layers").items()) c.dense_layers.push_back(l.as_int());
  }
  if (j.has("hf_extra")) c.hf_extra = j.at("hf_extra").as_string();
  read_fine_tuning(j, c);
  c.validate();
  return c;
}

ModelConfig ModelConfig::load(const std::string& name_or_path) {
  if (name_or_path.size() > 5 && name_or_path.substr(name_or_path.size() - 5) == ".json") {
    std::ifstream in(name_or_path);
    REMAT_CHECK(in.good(), IOError, "config: cannot read ", name_or_path);
    std::stringstream ss;
    ss << in.rdbuf();
    return from_json(Json::parse(ss.str(), name_or_path));
  }
  return named(name_or_path);
}

}  // namespace remat
