#include "tools/args.h"

#include <cstdlib>

#include "cuda/allocator_backend.h"
#include "cuda/runtime.h"

namespace remat::tools {

namespace {
std::string valid_list(const std::map<std::string, std::string>& valid) {
  std::string out;
  for (const auto& [name, help] : valid) out += "\n  --" + name + "  " + help;
  return out;
}
}  // namespace

Flags::Flags(const std::string& command, const std::vector<std::string>& args,
             const std::map<std::string, std::string>& valid, const std::set<std::string>& booleans)
    : command_(command) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    REMAT_CHECK(a.rfind("--", 0) == 0, Error, "unexpected argument '", a, "'; valid flags:",
                valid_list(valid));
    std::string name = a.substr(2), value;
    const auto eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    REMAT_CHECK(valid.count(name), Error, "unknown flag --", name, "; valid flags:", valid_list(valid));
    if (booleans.count(name)) {
      values_[name] = "1";
      continue;
    }
    if (eq == std::string::npos) {
      REMAT_CHECK(i + 1 < args.size(), Error, "flag --", name, " needs a value");
      value = args[++i];
    }
    values_[name] = value;
  }
}

std::string Flags::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

std::int64_t Flags::get_int(const std::string& name, std::int64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  REMAT_CHECK(end && *end == '\0' && !it->second.empty(), Error, "flag --", name,
              " expects an integer, got '", it->second, "'");
  return v;
}

double Flags::get_double(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  REMAT_CHECK(end && *end == '\0' && !it->second.empty(), Error, "flag --", name,
              " expects a number, got '", it->second, "'");
  return v;
}

Device device_flag(const Flags& f) {
  const Device device = Device::parse(f.get("device", "cpu"));
  if (device.is_cuda() && device.index < cuda::device_count()) cuda::set_device(device.index);
  return device;
}

}  // namespace remat::tools
