// Command-line flags of the CLI: --name value / --name=value / --flag.
// Unknown flags are an error that lists the valid ones.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/error.h"

namespace remat::tools {

class Flags {
 public:
  // Parses `args` for `command`, accepting only the flags in `valid`
  // (name -> help); boolean flags are given without a value.
  Flags(const std::string& command, const std::vector<std::string>& args,
        const std::map<std::string, std::string>& valid, const std::set<std::string>& booleans = {});

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string get(const std::string& name, const std::string& fallback) const;
  std::int64_t get_int(const std::string& name, std::int64_t fallback) const;
  double get_double(const std::string& name, double fallback) const;
  bool get_bool(const std::string& name) const { return has(name); }

 private:
  std::string command_;
  std::map<std::string, std::string> values_;
};

// --device (default cpu): cpu, cuda or cuda:N. A CUDA device that is present
// becomes the thread's current one, so kernels, cuBLASLt and the default
// stream run where the memory is (an absent one fails later, naming it).
Device device_flag(const Flags& f);

}  // namespace remat::tools
