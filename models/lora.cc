#include "models/lora.h"

#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <memory>
#include <sstream>

#include "engine/error.h"
#include "models/layers.h"

namespace remat {

const std::vector<std::string>& default_lora_targets() {
  static const std::vector<std::string> t = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return t;
}

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, sep);) out.push_back(part);
  if (!s.empty() && s.back() == sep) out.emplace_back();
  return out;
}

double number(const std::string& spec, const std::string& key, const std::string& v) {
  std::size_t used = 0;
  double d = 0;
  try {
    d = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  REMAT_CHECK(used == v.size() && !v.empty() && std::isfinite(d), Error, "--lora '", spec, "': ", key, "=", v,
              " is not a number");
  return d;
}

// The last part of a module name ("model.layers.0.self_attn.q_proj" -> "q_proj").
std::string leaf(const std::string& name) {
  const std::size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

}  // namespace

LoraConfig LoraConfig::parse(const std::string& spec) {
  LoraConfig c;
  bool alpha_given = false, targets_given = false;
  const std::vector<std::string> parts = split(spec, ',');
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const std::size_t eq = parts[i].find('=');
    const std::string key = parts[i].substr(0, eq), value = eq == std::string::npos ? "" : parts[i].substr(eq + 1);
    REMAT_CHECK(eq != std::string::npos, Error, "--lora '", spec, "': '", parts[i],
                "' is not KEY=VALUE (keys: r, alpha, dropout, targets)");
    if (key == "r") {
      const double r = number(spec, key, value);
      REMAT_CHECK(r >= 1 && r == std::floor(r) && r < 1e9, Error, "--lora '", spec, "': r must be an integer >= 1, got ", value);
      c.r = std::int64_t(r);
    } else if (key == "alpha") {
      c.alpha = number(spec, key, value);
      alpha_given = true;
      REMAT_CHECK(c.alpha > 0, Error, "--lora '", spec, "': alpha must be > 0, got ", value);
    } else if (key == "dropout") {
      c.dropout = number(spec, key, value);
      REMAT_CHECK(c.dropout >= 0 && c.dropout < 1, Error, "--lora '", spec, "': dropout must be in [0, 1), got ", value);
    } else if (key == "targets") {  // the module names run to the end
      targets_given = true;
      c.targets = {value};
      for (++i; i < parts.size(); ++i) c.targets.push_back(parts[i]);
      for (const std::string& t : c.targets)
        REMAT_CHECK(!t.empty() && t.find('=') == std::string::npos && t.find('.') == std::string::npos, Error,
                    "--lora '", spec, "': targets= takes module names such as q_proj (the last part of a Linear's ",
                    "name), got '", t, "' (targets must come last)");
    } else {
      throw Error("--lora '" + spec + "': unknown key '" + key + "' (keys: r, alpha, dropout, targets)");
    }
  }
  REMAT_CHECK(c.r >= 1, Error, "--lora '", spec, "': r must be given, an integer >= 1 (e.g. r=16)");
  if (!alpha_given) c.alpha = 2.0 * double(c.r);
  if (!targets_given) c.targets = default_lora_targets();
  return c;
}

std::string LoraConfig::str() const {
  if (!enabled()) return "";
  auto shortest = [](double v) {  // (the shortest text that reads back as v)
    char buf[32];
    const auto res = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, res.ptr);
  };
  std::ostringstream o;
  o << "r=" << r << ",alpha=" << shortest(alpha) << ",dropout=" << shortest(dropout) << ",targets=";
  for (std::size_t i = 0; i < targets.size(); ++i) o << (i ? "," : "") << targets[i];
  return o.str();
}

bool is_lora_parameter(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

std::vector<std::string> apply_lora(Module& model, const LoraConfig& config, std::uint64_t seed) {
  std::vector<std::pair<std::string, Linear*>> chosen;
  std::vector<std::string> linear_names;
  for (const std::string& target : config.targets) {
    bool any = false;
    for (const auto& [name, m] : model.named_modules()) {
      auto* lin = dynamic_cast<Linear*>(m.get());
      if (!lin) continue;
      if (linear_names.size() < 64 && std::find(linear_names.begin(), linear_names.end(), leaf(name)) == linear_names.end())
        linear_names.push_back(leaf(name));
      if (leaf(name) != target) continue;
      REMAT_CHECK(lin->adaptable, Error, "--lora: target '", target, "' names ", name,
                  ", whose weight the model reads directly (the MoE router, the LM head): an adapter there would "
                  "not be used; leave it out of targets=");
      any = true;
      chosen.emplace_back(name, lin);
    }
    if (!any) {
      std::string have;
      for (const std::string& n : linear_names) have += (have.empty() ? "" : ", ") + n;
      throw Error("--lora: target '" + target + "' matches no Linear of the model (its Linear modules: " + have + ")");
    }
  }
  for (auto& [name, p] : model.named_parameters()) p.set_requires_grad(false);
  std::vector<std::string> adapted;
  for (auto& [name, lin] : chosen) {
    if (lin->has_lora()) continue;  // (a target named twice)
    const std::string key = name + ".lora_A.weight";
    const RngState draw{seed ^ XXH3_64bits(key.data(), key.size()), 0};
    lin->add_lora(config.r, config.alpha, config.dropout, draw);
    adapted.push_back(name);
  }
  return adapted;
}

}  // namespace remat
