#include "tests/fuzz/targets.h"
#include "tests/fuzz/invariant.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "checkpoint/plan.h"
#include "engine/error.h"
#include "engine/json.h"
#include "models/config.h"
#include "train/safetensors.h"

namespace remat::fuzz {

namespace {

// Exercises the typed accessors of every value in `j` (each either answers
// or throws remat::Error).
void walk(const Json& j) {
  auto attempt = [](auto&& f) {
    try {
      f();
    } catch (const Error&) {
    }
  };
  switch (j.type()) {
    case Json::Type::number:
      attempt([&] { (void)j.as_int(); });
      (void)j.as_number();
      break;
    case Json::Type::boolean: (void)j.as_bool(); break;
    case Json::Type::string: (void)j.as_string(); break;
    case Json::Type::array:
      for (const auto& v : j.items()) walk(v);
      break;
    case Json::Type::object:
      for (const auto& [k, v] : j.members()) {
        if (!j.has(k) || &j.at(k) != &v) broken("json", "member \"" + k + "\" not found by at()");
        walk(v);
      }
      break;
    case Json::Type::null: break;
  }
  attempt([&] { (void)j.as_string(); });
  attempt([&] { (void)j.at("dtype"); });
}

// The folder for the safetensors target's files: one per process, removed
// when the process exits normally.
class TempDir {
 public:
  TempDir() {
    namespace fs = std::filesystem;
    fs::path base;
    if (const char* env = std::getenv("REMAT_FUZZ_TMPDIR"); env && *env)
      base = env;
    else if (fs::is_directory("/dev/shm"))
      base = "/dev/shm";
    else
      base = fs::temp_directory_path();
    dir_ = base / ("remat-fuzz-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

 private:
  std::filesystem::path dir_;
};

const TempDir& temp_dir() {
  static const TempDir dir;
  return dir;
}

void write_input(const std::string& path, std::string_view input, const char* target) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(input.data(), std::streamsize(input.size()));
  if (!f) broken(target, "cannot write the input to " + path);
}

bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.sizes() == b.sizes() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

}  // namespace

bool json(std::string_view input) {
  Json j;
  try {
    j = Json::parse(std::string(input), "fuzz input");
  } catch (const Error&) {
    return false;
  }
  walk(j);
  const std::string once = j.dump();
  std::string twice;
  try {
    twice = Json::parse(once, "dumped fuzz input").dump();
  } catch (const Error& e) {
    broken("json", "the parser rejects its own output " + once + ": " + e.what());
  }
  if (twice != once) broken("json", "dump is not stable: " + once + " then " + twice);
  return true;
}

bool config(std::string_view input) {
  const std::string path = temp_dir().file("in.json");
  write_input(path, input, "config");
  ModelConfig c;
  try {
    c = ModelConfig::load(path);
  } catch (const Error&) {
    return false;
  }
  (void)c.head_dim();
  (void)c.is_moe_layer(0);
  const std::string text = c.to_json().dump();
  ModelConfig back;
  try {
    back = ModelConfig::from_json(Json::parse(text, "written config"));
  } catch (const Error& e) {
    broken("config", "an accepted config does not load back from " + text + ": " + e.what());
  }
  if (back.to_json().dump() != text)
    broken("config", "config changes through to_json/from_json: " + text + " then " + back.to_json().dump());
  return true;
}

bool plan(std::string_view input) {
  std::int64_t n_layers = 4;
  std::string spec(input);
  if (const auto nl = input.find('\n'); nl != std::string_view::npos && nl > 0 && nl <= 6 &&
                                        input.substr(0, nl).find_first_not_of("0123456789") ==
                                            std::string_view::npos) {
    n_layers = std::clamp<std::int64_t>(std::atoll(std::string(input.substr(0, nl)).c_str()), 1, 4096);
    spec = std::string(input.substr(nl + 1));
  }
  RecomputePlan p;
  try {
    p = RecomputePlan::parse(spec, n_layers);
  } catch (const Error&) {
    return false;
  }
  std::set<std::int64_t> seen;
  for (const auto& region : p.block_regions) {
    if (region.empty()) broken("plan", "'" + spec + "' has an empty block region");
    for (auto b : region) {
      if (b < 0 || b >= n_layers)
        broken("plan", "'" + spec + "' names block " + std::to_string(b) + " of " + std::to_string(n_layers));
      if (!seen.insert(b).second) broken("plan", "'" + spec + "' puts block " + std::to_string(b) + " in two regions");
      if (!p.block_in_region(b)) broken("plan", "block_in_region disagrees with block_regions");
    }
  }
  if (p.region_reentrant.size() != p.block_regions.size() || p.region_policies.size() != p.block_regions.size())
    broken("plan", "'" + spec + "' has region_reentrant or region_policies not one per block region");
  for (std::size_t r = 0; r < p.block_regions.size(); ++r)
    if (p.reentrant_region(r) && p.region_policies[r])
      broken("plan", "'" + spec + "' has a reentrant region with an op policy");
  bool same = false;
  try {
    same = RecomputePlan::parse(p.str(), n_layers) == p;
  } catch (const Error& e) {
    broken("plan", "'" + spec + "' prints as '" + p.str() + "', which does not parse: " + e.what());
  }
  if (!same) broken("plan", "'" + spec + "' prints as '" + p.str() + "', which parses to another plan");
  if (p.block_in_region(-1) || p.block_in_region(n_layers))
    broken("plan", "block_in_region is true outside [0, " + std::to_string(n_layers) + ")");
  if (p.spec != spec) broken("plan", "spec '" + p.spec + "' is not the parsed '" + spec + "'");
  return true;
}

bool safetensors(std::string_view input) {
  const std::string in = temp_dir().file("in.safetensors");
  write_input(in, input, "safetensors");
  SafetensorsFile st;
  try {
    st = load_safetensors(in);
  } catch (const Error&) {
    return false;
  }
  std::vector<std::pair<std::string, Tensor>> tensors(st.tensors.begin(), st.tensors.end());
  const std::string out = temp_dir().file("out.safetensors");
  SafetensorsFile back;
  try {
    save_safetensors(out, tensors, st.metadata);
    back = load_safetensors(out);
  } catch (const Error& e) {
    broken("safetensors", std::string("an accepted file does not save and load back: ") + e.what());
  }
  if (back.tensors.size() != st.tensors.size()) broken("safetensors", "tensor count changes through save/load");
  for (const auto& [name, t] : st.tensors) {
    auto it = back.tensors.find(name);
    if (it == back.tensors.end() || !same_tensor(t, it->second))
      broken("safetensors", "tensor '" + name + "' changes through save/load");
  }
  for (const auto& [k, v] : st.metadata) {
    auto it = back.metadata.find(k);
    if (it == back.metadata.end() || it->second != v)
      broken("safetensors", "metadata '" + k + "' changes through save/load");
  }
  if (!back.checksummed) broken("safetensors", "a file saved with checksums loads as unchecksummed");
  return true;
}

const std::vector<Target>& targets() {
  static const std::vector<Target> all = {{"json", &json},
                                          {"config", &config},
                                          {"plan", &plan},
                                          {"safetensors", &safetensors},
                                          {"tokenizer", &tokenizer},
                                          {"tokenizer_config", &tokenizer_config},
                                          {"hf_config", &hf_config},
                                          {"hf_index", &hf_index},
                                          {"token_shard", &token_shard},
                                          {"safetensors_decode", &safetensors_decode}};
  return all;
}

}  // namespace remat::fuzz
