#include "models/module.h"

#include <algorithm>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/grad_mode.h"

namespace remat {

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(const std::string& prefix) const {
  std::vector<std::pair<std::string, Tensor>> out;
  const std::string p = prefix.empty() ? "" : prefix + ".";
  for (const auto& [name, t] : params_) out.emplace_back(p + name, t);
  for (const auto& [name, child] : children_) {
    auto sub = child->named_parameters(p + name);
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

std::int64_t Module::num_parameters() const {
  std::int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

Tensor Module::parameter(const std::string& name) const {
  for (auto& [n, t] : named_parameters())
    if (n == name) return t;
  throw Error("no parameter named '" + name + "'");
}

void Module::to(Device device) {
  CategoryScope cat(MemoryCategory::parameter);
  for (auto& [n, t] : named_parameters()) {
    Tensor p = t;
    p.move_to_(device);
  }
}

void Module::zero_grad() {
  // Gradient buffers stay allocated (zeroed in place), so parameters,
  // gradients and optimizer state form a constant persistent footprint and
  // backward accumulates into the same memory every step.
  NoGradGuard ng;
  for (auto& [n, t] : named_parameters())
    if (Tensor g = t.grad(); g.defined()) g.zero_();
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules(
    const std::string& prefix) const {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  for (const auto& [name, child] : children_) {
    const std::string full = prefix.empty() ? name : prefix + "." + name;
    out.emplace_back(full, child);
    auto sub = child->named_modules(full);
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::trainable_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [n, t] : named_parameters())
    if (t.requires_grad()) out.emplace_back(n, t);
  return out;
}

std::vector<Tensor> trainable_tensors(const Module& m) {
  std::vector<Tensor> out;
  for (auto& [n, t] : m.trainable_parameters()) out.push_back(t);
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  t.set_requires_grad(true);
  params_.emplace_back(name, t);
  return t;
}

namespace {

// '[A-B]' at pattern[i]: the bounds and the index past ']' (Error if malformed).
struct NumberRange {
  std::int64_t lo = 0, hi = 0;
  std::size_t end = 0;
};
NumberRange number_range(const std::string& pattern, std::size_t i) {
  const std::size_t close = pattern.find(']', i);
  const std::string body = close == std::string::npos ? "" : pattern.substr(i + 1, close - i - 1);
  const std::size_t dash = body.find('-');
  auto digits = [](const std::string& t) {
    return !t.empty() && t.size() < 18 && std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  const std::string a = dash == std::string::npos ? body : body.substr(0, dash);
  const std::string b = dash == std::string::npos ? body : body.substr(dash + 1);
  REMAT_CHECK(close != std::string::npos && digits(a) && digits(b) && std::stoll(a) <= std::stoll(b), Error,
              "--freeze pattern '", pattern, "': '[' must open a number range [A-B] with A <= B (e.g. [0-11])");
  return {std::stoll(a), std::stoll(b), close + 1};
}

bool matches_from(const std::string& p, std::size_t i, const std::string& s, std::size_t j) {
  while (i < p.size()) {
    if (p[i] == '*') {
      for (std::size_t k = j; k <= s.size(); ++k)
        if (matches_from(p, i + 1, s, k)) return true;
      return false;
    }
    if (p[i] == '[') {
      const NumberRange r = number_range(p, i);
      std::size_t k = j;
      while (k < s.size() && s[k] >= '0' && s[k] <= '9' && k - j < 18) ++k;
      if (k == j || (s[j] == '0' && k - j > 1)) return false;  // (no number, or a leading zero)
      const std::int64_t n = std::stoll(s.substr(j, k - j));
      if (n < r.lo || n > r.hi) return false;
      i = r.end;
      j = k;
      continue;
    }
    if (j >= s.size() || (p[i] != '?' && p[i] != s[j])) return false;
    ++i;
    ++j;
  }
  return j == s.size();
}

}  // namespace

bool name_matches(const std::string& pattern, const std::string& name) {
  for (std::size_t i = pattern.find('['); i != std::string::npos; i = pattern.find('[', i + 1))
    number_range(pattern, i);  // (a malformed range is an error even where nothing reaches it)
  return matches_from(pattern, 0, name, 0);
}

std::vector<std::string> freeze_parameters(const Module& m, const std::vector<std::string>& patterns) {
  const auto params = m.named_parameters();
  std::vector<std::string> frozen;
  std::vector<Tensor> to_freeze;
  for (const std::string& pat : patterns) {
    REMAT_CHECK(!pat.empty(), Error, "--freeze: an empty pattern (patterns are separated by ',')");
    bool any = false;
    for (const auto& [name, p] : params) {
      if (!name_matches(pat, name)) continue;
      any = true;
      if (std::find(frozen.begin(), frozen.end(), name) != frozen.end()) continue;
      frozen.push_back(name);
      to_freeze.push_back(p);
    }
    REMAT_CHECK(any, Error, "--freeze pattern '", pat, "' matches no parameter of the model (", params.size(),
                " parameters, e.g. ", params.empty() ? std::string("none") : params.front().first,
                "; '*' matches any run of characters, [A-B] a number range)");
  }
  for (Tensor& p : to_freeze) p.set_requires_grad(false);
  return frozen;
}

}  // namespace remat
