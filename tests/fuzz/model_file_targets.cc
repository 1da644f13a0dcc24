// The fuzz targets of targets.h for model and data files, all in memory: a
// Hugging Face config.json and model.safetensors.index.json, the token-shard
// header, and the safetensors decoder.
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/error.h"
#include "engine/json.h"
#include "models/config.h"
#include "models/hf_config.h"
#include "tests/fuzz/invariant.h"
#include "tests/fuzz/targets.h"
#include "train/hf_files.h"
#include "train/safetensors.h"
#include "train/token_shards.h"

namespace remat::fuzz {

namespace {

// `c` written by to_json with hf_extra left out (compared on its own).
std::string without_extra(ModelConfig c) {
  c.hf_extra.clear();
  return c.to_json().dump();
}

// A ModelConfig from config_from_hf goes through a saved state's
// to_json -> from_json unchanged.
void check_state_round_trip(const ModelConfig& c) {
  const std::string text = c.to_json().dump();
  ModelConfig back;
  try {
    back = ModelConfig::from_json(Json::parse(text, "written config"));
  } catch (const Error& e) {
    broken("hf_config", "an imported config does not load back from " + text + ": " + e.what());
  }
  if (back.to_json().dump() != text)
    broken("hf_config", "config changes through to_json/from_json: " + text + " then " + back.to_json().dump());
}

// Export then import gives the same config, and keeps every passed-through
// key that export does not write itself (the dtype it is given, and keys an
// import ignored, such as the MoE keys of a Qwen2-MoE without experts).
void check_export_round_trip(const ModelConfig& c) {
  Json exported, own;
  HfConfig back;
  try {
    exported = config_to_hf(c, "bfloat16");
    ModelConfig bare = c;
    bare.hf_extra.clear();
    own = config_to_hf(bare, "bfloat16");
    back = config_from_hf(Json::parse(exported.dump(), "exported config.json"), "exported config.json");
  } catch (const Error& e) {
    broken("hf_config", "an imported config " + c.to_json().dump() + " does not export and import back: " + e.what());
  }
  if (without_extra(back.config) != without_extra(c))
    broken("hf_config", "config changes through export/import: " + without_extra(c) + " then " +
                            without_extra(back.config) + " (via " + exported.dump() + ")");
  const Json extra = Json::parse(c.hf_extra, "hf_extra");
  const Json back_extra = Json::parse(back.config.hf_extra, "exported hf_extra");
  for (const auto& [k, v] : extra.members())
    if (k != "dtype" && k != "torch_dtype" && !own.has(k) && (!back_extra.has(k) || back_extra.at(k).dump() != v.dump()))
      broken("hf_config", "passed-through key \"" + k + "\" is lost or changed by export/import");
}

bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.sizes() == b.sizes() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

// The reader over the same bytes agrees with the decoded file, tensor by tensor.
void check_reader(std::string_view input, const SafetensorsFile& st) {
  const SafetensorsReader reader = SafetensorsReader::from_bytes(input, "fuzz.safetensors");
  if (reader.names().size() != st.tensors.size() || reader.metadata() != st.metadata ||
      reader.checksummed() != st.checksummed)
    broken("safetensors_decode", "the reader and decode_safetensors disagree on names, metadata or checksums");
  for (const auto& [name, t] : st.tensors) {
    if (reader.dtype(name) != t.dtype() || reader.shape(name) != t.sizes() || reader.nbytes(name) != t.nbytes())
      broken("safetensors_decode", "tensor '" + name + "': the reader's dtype, shape or size differ");
    Tensor into = empty(t.sizes(), t.dtype());
    reader.read_into(name, into);
    if (!same_tensor(into, t)) broken("safetensors_decode", "tensor '" + name + "': read_into differs from read");
    if (t.dtype() == DType::bf16 || t.dtype() == DType::f16) {
      const Tensor widened = reader.read(name, DType::f32);
      if (!same_tensor(widened, t.to(DType::f32)))
        broken("safetensors_decode", "tensor '" + name + "': widening in place differs from a cast to f32");
    }
  }
}

}  // namespace

bool hf_config(std::string_view input) {
  HfConfig h;
  try {
    h = config_from_hf(Json::parse(std::string(input), "fuzz config.json"), "fuzz config.json");
  } catch (const Error&) {
    return false;
  }
  try {
    h.config.validate();
  } catch (const Error& e) {
    broken("hf_config", std::string("an imported config is not valid: ") + e.what());
  }
  check_state_round_trip(h.config);
  check_export_round_trip(h.config);
  return true;
}

bool hf_index(std::string_view input) {
  HfIndex index;
  try {
    index = parse_hf_index(std::string(input), "fuzz model.safetensors.index.json");
  } catch (const Error&) {
    return false;
  }
  if (index.total_size && *index.total_size < 0) broken("hf_index", "a negative total_size is accepted");
  for (const auto& [tensor, f] : index.weight_map)
    if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos || f.find('\0') != std::string::npos)
      broken("hf_index", "tensor '" + tensor + "' maps to '" + f + "', not a plain file name");
  return true;
}

bool token_shard(std::string_view input) {
  ShardInfo s;
  try {
    s = parse_shard_header(input, input.size(), "fuzz.tok");
  } catch (const Error&) {
    return false;
  }
  const auto head = std::string(s.path) + ": ";
  if (s.token_bytes != 2 && s.token_bytes != 4) broken("token_shard", head + "token bytes " + std::to_string(s.token_bytes));
  if (s.count < 0) broken("token_shard", head + "negative token count " + std::to_string(s.count));
  const unsigned __int128 want = 64 + static_cast<unsigned __int128>(s.count) * unsigned(s.token_bytes);
  if (want != input.size())
    broken("token_shard", head + std::to_string(s.count) + " tokens of " + std::to_string(s.token_bytes) +
                              " bytes do not fill the " + std::to_string(input.size()) + " bytes of the file");
  if (s.vocab < 1 || s.vocab > (std::int64_t(1) << 32))
    broken("token_shard", head + "vocabulary " + std::to_string(s.vocab) + " outside [1, 2^32]");
  if (s.eos < -1 || s.eos >= s.vocab)
    broken("token_shard", head + "EOS " + std::to_string(s.eos) + " outside the vocabulary " + std::to_string(s.vocab));
  if (s.tokenizer_hash.size() != 16) broken("token_shard", head + "a tokenizer hash that is not 16 characters");
  // Every token the header counts is inside the input (ASan checks the reads).
  const TokenSpan span{input.data() + 64, s.count, s.token_bytes};
  volatile std::int64_t sink = 0;
  for (std::int64_t i = 0; i < span.count; ++i) sink = sink + span.at(i);
  return true;
}

bool safetensors_decode(std::string_view input) {
  SafetensorsFile st;
  try {
    st = decode_safetensors(input, "fuzz.safetensors");
  } catch (const Error&) {
    return false;
  }
  check_reader(input, st);
  const std::vector<std::pair<std::string, Tensor>> tensors(st.tensors.begin(), st.tensors.end());
  SafetensorsFile back;
  try {
    back = decode_safetensors(encode_safetensors(tensors, st.metadata, {}, "re-encoded"), "re-encoded");
  } catch (const Error& e) {
    broken("safetensors_decode", std::string("an accepted file does not encode and decode back: ") + e.what());
  }
  if (back.metadata != st.metadata || back.tensors.size() != st.tensors.size() || !back.checksummed)
    broken("safetensors_decode", "metadata, tensor count or checksums change through encode/decode");
  for (const auto& [name, t] : st.tensors) {
    const auto it = back.tensors.find(name);
    if (it == back.tensors.end() || !same_tensor(t, it->second))
      broken("safetensors_decode", "tensor '" + name + "' changes through encode/decode");
  }
  return true;
}

}  // namespace remat::fuzz
