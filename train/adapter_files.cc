#include "train/adapter_files.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "engine/allocator.h"
#include "engine/error.h"
#include "engine/grad_mode.h"
#include "engine/json.h"
#include "ops/binary.h"
#include "ops/matmul.h"
#include "train/file_io.h"
#include "train/hf_model.h"
#include "train/safetensors.h"

namespace remat {

namespace fs = std::filesystem;

namespace {

bool null_or_false(const Json& v) { return v.is_null() || (v.type() == Json::Type::boolean && !v.as_bool()); }
bool null_or_empty(const Json& v) {
  return v.is_null() || (v.is_array() && v.items().empty()) || (v.is_object() && v.members().empty()) ||
         (v.is_string() && v.as_string().empty());
}

// PEFT LoraConfig keys whose non-default values ask for something remat's
// LoRA does not do; keys not listed (and not read) are ignored.
struct Unsupported {
  const char* key;
  bool (*neutral)(const Json&);
  const char* what;
};
constexpr Unsupported kUnsupported[] = {
    {"use_dora", null_or_false, "DoRA (weight-decomposed adapters) is not supported"},
    {"use_rslora", null_or_false, "rsLoRA's scaling alpha / sqrt(r) is not supported"},
    {"fan_in_fan_out", null_or_false, "fan_in_fan_out (weights stored [in, out], GPT-2's Conv1D) is not supported"},
    {"modules_to_save", null_or_empty, "modules_to_save (whole modules trained beside the adapters) is not supported"},
    {"rank_pattern", null_or_empty, "rank_pattern (a rank per module) is not supported"},
    {"alpha_pattern", null_or_empty, "alpha_pattern (an alpha per module) is not supported"},
    {"layers_to_transform", null_or_empty, "layers_to_transform (adapters on some layers only) is not supported"},
    {"layer_replication", null_or_empty, "layer_replication is not supported"},
    {"exclude_modules", null_or_empty, "exclude_modules is not supported"},
    {"target_parameters", null_or_empty, "target_parameters (adapters on parameters, not modules) is not supported"},
    {"trainable_token_indices", null_or_empty, "trainable_token_indices is not supported"},
    {"lora_bias", null_or_false, "lora_bias (a bias on lora_B) is not supported"},
    {"use_qalora", null_or_false, "QALoRA is not supported"},
    {"use_bdlora", null_or_false, "block-diagonal LoRA is not supported"},
    {"alora_invocation_tokens", null_or_empty, "activated LoRA (adapters from an invocation on) is not supported"},
    {"arrow_config", null_or_empty, "Arrow routing between adapters is not supported"},
    {"lora_ga_config", null_or_empty, "LoRA-GA (which changes the base weights) is not supported"},
    {"kasa_config", null_or_empty, "KaSA is not supported"},
    {"monteclora_config", null_or_empty, "MonteCLoRA is not supported"},
    {"velora_config", null_or_empty, "VeLoRA is not supported"},
};

// Error "PATH: "KEY" WHY".
[[noreturn]] void bad_key(const std::string& path, const std::string& key, const std::string& why) {
  throw Error(path + ": \"" + key + "\" " + why);
}

// The keys that describe the adapter's kind, checked before its numbers.
void check_supported(const Json& j, const std::string& path) {
  REMAT_CHECK(j.is_object(), Error, path, ": not a JSON object");
  if (!j.has("peft_type") || !j.at("peft_type").is_string() || j.at("peft_type").as_string() != "LORA")
    bad_key(path, "peft_type", "must be \"LORA\" (remat reads LoRA adapters only), got " +
                                   (j.has("peft_type") ? j.at("peft_type").dump() : std::string("nothing")));
  if (j.has("task_type") && !j.at("task_type").is_null() &&
      !(j.at("task_type").is_string() && j.at("task_type").as_string() == "CAUSAL_LM"))
    bad_key(path, "task_type", "is " + j.at("task_type").dump() + ": remat's models are causal LMs (CAUSAL_LM)");
  if (j.has("bias") && !(j.at("bias").is_string() && j.at("bias").as_string() == "none"))
    bad_key(path, "bias", "is " + j.at("bias").dump() + ": only \"none\" is supported (no trained biases)");
  for (const Unsupported& u : kUnsupported)
    if (j.has(u.key) && !u.neutral(j.at(u.key))) bad_key(path, u.key, "is " + j.at(u.key).dump() + ": " + u.what);
  if (j.has("init_lora_weights")) {  // (these change the base weights: the adapter needs the changed base)
    const Json& v = j.at("init_lora_weights");
    const bool plain = v.type() == Json::Type::boolean || (v.is_string() && (v.as_string() == "gaussian" ||
                                                                              v.as_string() == "eva"));
    if (!plain)
      bad_key(path, "init_lora_weights", "is " + v.dump() + ": that initialisation changes the base model's "
              "weights, so the adapter works only with the changed base; convert it to a plain LoRA adapter first "
              "(PEFT: save_pretrained(..., path_initial_model_for_weight_conversion=...))");
  }
}

// target_modules: a list of module names (the last part of a Linear's name).
std::vector<std::string> read_targets(const Json& j, const std::string& path) {
  if (!j.has("target_modules") || j.at("target_modules").is_null())
    bad_key(path, "target_modules", "is missing: remat needs the list of adapted modules");
  const Json& t = j.at("target_modules");
  if (t.is_string())
    bad_key(path, "target_modules", "is a regular expression (" + t.dump() + "); remat reads a list of module "
            "names such as [\"q_proj\", \"v_proj\"]");
  if (!t.is_array() || t.items().empty()) bad_key(path, "target_modules", "must be a non-empty list of names");
  std::vector<std::string> out;
  for (const Json& name : t.items()) {
    if (!name.is_string() || name.as_string().empty() || name.as_string().find('.') != std::string::npos)
      bad_key(path, "target_modules", "holds " + name.dump() + ": remat takes module names without dots (the last "
              "part of a Linear's name, e.g. q_proj)");
    out.push_back(name.as_string());
  }
  return out;
}

// The LoRA numbers: r, lora_alpha (PEFT's default 8), lora_dropout (default 0).
LoraConfig read_lora(const Json& j, const std::string& path) {
  LoraConfig c;
  try {
    if (!j.has("r")) bad_key(path, "r", "is missing");
    c.r = j.at("r").as_int();
    c.alpha = j.has("lora_alpha") ? j.at("lora_alpha").as_number() : 8.0;
    c.dropout = j.has("lora_dropout") ? j.at("lora_dropout").as_number() : 0.0;
  } catch (const IOError& e) {  // (a value of the wrong type)
    throw Error(path + ": r, lora_alpha and lora_dropout must be numbers (r an integer): " + e.what());
  }
  if (c.r < 1) bad_key(path, "r", "must be an integer >= 1, got " + std::to_string(c.r));
  if (!(c.alpha > 0)) bad_key(path, "lora_alpha", "must be > 0, got " + Json::format_number(c.alpha));
  if (!(c.dropout >= 0 && c.dropout < 1)) bad_key(path, "lora_dropout", "must be in [0, 1), got " +
                                                                          Json::format_number(c.dropout));
  c.targets = read_targets(j, path);
  return c;
}

// The remat parameter name of an adapter file's tensor: PEFT's
// "base_model.model.X" with an adapter name segment ("lora_A.default.weight")
// taken out; "" when `key` is not such a name.
std::string remat_name(const std::string& key) {
  const std::size_t prefix = std::strlen(kPeftPrefix);
  if (key.compare(0, prefix, kPeftPrefix) != 0) return "";
  std::string name = key.substr(prefix);
  for (const char* part : {".lora_A.default.", ".lora_B.default."})
    if (const std::size_t at = name.find(part); at != std::string::npos) name.erase(at + 8, 8);  // "default."
  return name;
}

// The file's tensors by remat name, checked against the model's adapter
// parameters (`mine`: name -> shape); IOError naming the first problem of
// the worst kind and how many there are.
std::map<std::string, std::string> match_tensors(const DecoderModel& model, const std::map<std::string, Shape>& mine,
                                                 const SafetensorsReader& file, const std::string& dir,
                                                 const std::string& base) {
  std::map<std::string, std::string> key_of;  // remat name -> file key
  std::vector<std::string> misshapen, unexpected, missing;
  for (const std::string& key : file.names()) {
    const std::string name = remat_name(key);
    const auto it = mine.find(name);
    if (it == mine.end()) {
      if (name.empty() || !is_lora_parameter(name) || !held_by_another_rank(model, name)) unexpected.push_back(key);
      continue;
    }
    REMAT_CHECK(!key_of.count(name), IOError, "--adapter ", dir, ": tensors ", key_of[name], " and ", key,
                " are both ", name);
    REMAT_CHECK(is_floating(file.dtype(key)), IOError, "--adapter ", dir, ": tensor ", key, " is ",
                dtype_name(file.dtype(key)), ", not floating point");
    if (file.shape(key) != it->second)
      misshapen.push_back(key + " is " + shape_str(file.shape(key)) + ", the model's " + name + " is " +
                          shape_str(it->second));
    key_of[name] = key;
  }
  for (const auto& [name, shape] : mine)
    if (!key_of.count(name)) missing.push_back(name + " " + shape_str(shape));
  const auto more = [](const std::vector<std::string>& v) {
    return v.size() > 1 ? " (and " + std::to_string(v.size() - 1) + " more)" : std::string();
  };
  const std::string other = ": probably an adapter for another base model (its adapter_config.json names " +
                            (base.empty() ? std::string("none") : "'" + base + "'") + "; this model is " +
                            model.config().name + ")";
  REMAT_CHECK(misshapen.empty(), IOError, "--adapter ", dir, ": tensor ", misshapen[0], more(misshapen), other);
  REMAT_CHECK(unexpected.empty(), IOError, "--adapter ", dir, ": tensor ", unexpected[0], more(unexpected),
              " is not an adapter parameter of the model (expected base_model.model.<name>.lora_A.weight / "
              ".lora_B.weight for the adapted modules)", other);
  REMAT_CHECK(missing.empty(), IOError, "--adapter ", dir, ": ", kAdapterWeightsFile, " has no tensor for ",
              missing[0], more(missing), " (expected ", kPeftPrefix, missing[0].substr(0, missing[0].find(' ')), ")");
  return key_of;
}

std::string sorted_targets(std::vector<std::string> t) {
  std::sort(t.begin(), t.end());
  std::string s;
  for (const std::string& x : t) s += x + ",";
  return s;
}

}  // namespace

bool same_adapters(const LoraConfig& a, const LoraConfig& b) {
  return a.r == b.r && a.alpha == b.alpha && a.dropout == b.dropout &&
         sorted_targets(a.targets) == sorted_targets(b.targets);
}

std::string adapter_config_json(const LoraConfig& lora, const std::string& base_model) {
  Json targets = Json::array();
  for (const std::string& t : lora.targets) targets.push(Json::string(t));
  Json j = Json::object();
  j.set("alpha_pattern", Json::object()).set("rank_pattern", Json::object());
  j.set("base_model_name_or_path", base_model.empty() ? Json() : Json::string(base_model));
  j.set("bias", Json::string("none")).set("peft_type", Json::string("LORA")).set("task_type", Json::string("CAUSAL_LM"));
  for (const char* no : {"fan_in_fan_out", "use_dora", "use_rslora"}) j.set(no, Json::boolean(false));
  j.set("inference_mode", Json::boolean(true)).set("init_lora_weights", Json::boolean(true));
  for (const char* null : {"layers_pattern", "layers_to_transform", "modules_to_save", "revision"}) j.set(null, Json());
  j.set("r", Json::number(double(lora.r))).set("lora_alpha", Json::number(lora.alpha));
  j.set("lora_dropout", Json::number(lora.dropout)).set("target_modules", targets);
  return j.dump();
}

AdapterConfig read_adapter_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / kAdapterConfigFile).string();
  std::error_code ec;
  REMAT_CHECK(fs::is_regular_file(path, ec), IOError, "--adapter ", dir, ": no ", kAdapterConfigFile,
              " (a PEFT adapter folder holds ", kAdapterConfigFile, " and ", kAdapterWeightsFile, ")");
  const Json j = Json::parse(file_io::read_file(path), path);
  check_supported(j, path);
  AdapterConfig a;
  a.lora = read_lora(j, path);
  if (j.has("base_model_name_or_path") && j.at("base_model_name_or_path").is_string())
    a.base_model = j.at("base_model_name_or_path").as_string();
  return a;
}

void save_adapter(const std::string& dir, const LoraConfig& lora,
                  const std::vector<std::pair<std::string, Tensor>>& parameters, const std::string& base_model,
                  DType dtype) {
  REMAT_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, DTypeError,
              "save_adapter: the adapter's dtype must be f32, bf16 or f16, got ", dtype_name(dtype));
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, t] : parameters)
    if (is_lora_parameter(name)) tensors.emplace_back(kPeftPrefix + name, t.dtype() == dtype ? t : t.to(dtype));
  REMAT_CHECK(lora.enabled() && !tensors.empty(), Error, "save_adapter: the model has no LoRA adapters (",
              parameters.size(), " parameters, none named *.lora_A.* / *.lora_B.*)");
  std::error_code ec;
  fs::create_directories(dir, ec);
  REMAT_CHECK(!ec, IOError, "save_adapter: cannot create ", dir, ": ", ec.message());
  const std::string config = (fs::path(dir) / kAdapterConfigFile).string();
  if (fs::remove(config, ec)) fsync_dir(dir);  // (no config over new weights, should this stop half-way)
  REMAT_CHECK(!ec, IOError, "save_adapter: cannot remove ", config, ": ", ec.message());
  save_safetensors((fs::path(dir) / kAdapterWeightsFile).string(), tensors, {{"format", "pt"}}, {.checksums = false});
  write_file_atomic(config, adapter_config_json(lora, base_model) + "\n");
}

void load_adapter(DecoderModel& model, const std::string& dir) {
  const AdapterConfig a = read_adapter_config(dir);
  const LoraConfig& built = model.config().lora;
  REMAT_CHECK(same_adapters(a.lora, built), Error, "--adapter ", dir, ": its config is LoRA ", a.lora.str(),
              ", but the model was built with ", built.enabled() ? "LoRA " + built.str() : std::string("none"));
  const std::string path = (fs::path(dir) / kAdapterWeightsFile).string();
  std::error_code ec;
  REMAT_CHECK(fs::is_regular_file(path, ec), IOError, "--adapter ", dir, ": no ", kAdapterWeightsFile,
              fs::exists(fs::path(dir) / "adapter_model.bin", ec)
                  ? " (its adapter_model.bin is a PyTorch pickle, which remat does not read: save the adapter with "
                    "safe_serialization=True)"
                  : "");
  const SafetensorsReader file(path);
  std::map<std::string, Shape> mine;
  for (const auto& [name, p] : model.named_parameters())
    if (is_lora_parameter(name)) mine[name] = p.sizes();
  const std::map<std::string, std::string> key_of = match_tensors(model, mine, file, dir, a.base_model);
  if (mine.empty() || model.named_parameters().front().second.device().is_meta()) return;  // (shapes only)
  NoGradGuard ng;
  CategoryScope cat(MemoryCategory::parameter);
  for (auto& [name, p] : model.named_parameters()) {
    if (!mine.count(name)) continue;
    Tensor dst = p;
    if (dst.device().is_cpu() && dst.is_contiguous() && dst.dtype() == DType::f32)
      file.read_into(key_of.at(name), dst);  // (bf16 / f16 widened in place)
    else
      dst.copy_(file.read(key_of.at(name), DType::f32));
  }
}

std::vector<HfTensorSource> merge_lora(const std::vector<HfTensorSource>& parameters, const LoraConfig& lora) {
  std::map<std::string, const HfTensorSource*> by_name;
  std::set<std::string> unmerged;  // adapter A's not yet matched with their weight
  for (const HfTensorSource& s : parameters) {
    by_name[s.name] = &s;
    if (s.name.find(".lora_A.") != std::string::npos) unmerged.insert(s.name);
  }
  const double scaling = lora.scaling();
  std::vector<HfTensorSource> out;
  for (const HfTensorSource& s : parameters) {
    if (is_lora_parameter(s.name)) continue;
    const std::string stem = s.name.size() > 7 && s.name.ends_with(".weight") ? s.name.substr(0, s.name.size() - 7) : "";
    const auto a = by_name.find(stem + ".lora_A.weight"), b = by_name.find(stem + ".lora_B.weight");
    if (stem.empty() || a == by_name.end()) {
      out.push_back(s);
      continue;
    }
    REMAT_CHECK(b != by_name.end(), Error, "merge_lora: ", a->first, " has no ", stem, ".lora_B.weight");
    unmerged.erase(a->first);
    out.push_back({s.name, s.shape, DType::f32, [w = s.read, ra = a->second->read, rb = b->second->read, scaling] {
                     NoGradGuard ng;
                     const Tensor A = ra().to(DType::f32), B = rb().to(DType::f32);
                     return add(w().to(DType::f32), mul(matmul(B, A), scaling));  // W + scaling B A, in f32
                   }});
  }
  REMAT_CHECK(unmerged.empty(), Error, "merge_lora: adapter ", unmerged.empty() ? "" : *unmerged.begin(),
              " has no weight to merge into");
  return out;
}

ModelConfig without_adapters(ModelConfig c) {
  c.lora = LoraConfig{};
  c.freeze.clear();
  return c;
}

}  // namespace remat
