#include "tools/bench_torch.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "engine/error.h"
#include "engine/json.h"
#include "tools/bench_worker.h"

namespace remat::tools {

namespace {

std::string find_torch_script() {
  namespace fs = std::filesystem;
  std::vector<fs::path> tried = {fs::current_path() / "tools/reference/bench_torch.py"};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    tried.push_back(exe.parent_path() / "bench_torch.py");
    tried.push_back(exe.parent_path().parent_path() / "bench_torch.py");
  }
  std::string list;
  for (const fs::path& p : tried) {
    if (fs::exists(p, ec)) return p.string();
    list += (list.empty() ? "" : ", ") + p.string();
  }
  throw Error("bench --baseline torch: tools/reference/bench_torch.py not found (looked at " + list +
              "); run bench from the repository root, e.g. ./remat bench");
}

}  // namespace

TorchBaseline::TorchBaseline(const ModelConfig& c)
    : script_(find_torch_script()),
      config_path_((std::filesystem::temp_directory_path() / ("remat-bench-" + std::to_string(::getpid()) + ".json"))
                       .string()) {
  std::ofstream out(config_path_);
  out << c.to_json().dump();
  REMAT_CHECK(out.good(), IOError, "bench: cannot write the baseline's config file ", config_path_);
}

TorchBaseline::~TorchBaseline() {
  std::error_code ec;
  std::filesystem::remove(config_path_, ec);
}

std::map<std::string, double> TorchBaseline::run(int threads, const std::string& dtype, const std::string& device,
                                                  std::int64_t warmup, std::int64_t steps) {
  const char* py = std::getenv("REMAT_PYTHON");
  const std::string cmd = std::string("'") + (py && *py ? py : "/usr/bin/python3") + "' '" + script_ + "' --config '" +
                          config_path_ + "' --threads " + std::to_string(threads) + " --dtype " + dtype +
                          " --device " + device + " --warmup " + std::to_string(warmup) + " --steps " +
                          std::to_string(steps) + " 2>&1";
  int rc = 0;
  const std::string out = run_capture(cmd, "the PyTorch baseline", &rc);
  const auto pos = out.rfind("\n{", out.size() - (out.size() > 1 ? 2 : 0));
  const std::string line = out.substr(pos == std::string::npos ? 0 : pos + 1);
  REMAT_CHECK(rc == 0 && !line.empty() && line[0] == '{', Error, "bench --baseline torch: ", cmd,
              " failed (exit ", rc, "):\n", out);
  const Json parsed = Json::parse(line.substr(0, line.find('\n')), "bench_torch.py output");
  std::map<std::string, double> r;
  for (const auto& [k, val] : parsed.members()) {
    if (val.is_number()) r[k] = val.as_number();
    if (k == "framework") framework_ = val.as_string();
  }
  for (const char* k : {"step_ms", "step_ms_min", "forward_ms", "backward_ms", "tokens"})
    REMAT_CHECK(r.count(k), Error, "bench --baseline torch: bench_torch.py printed no '", k, "':\n", out);
  r["step_ms_best"] = r.at("step_ms_min");  // its fastest timed step, as the workers' step_ms_best
  return r;
}

}  // namespace remat::tools
