// ./remat bench --baseline torch: PyTorch eager on the same model
// (tools/reference/bench_torch.py), run as one more variant of the bench's
// interleaved order.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "models/config.h"

namespace remat::tools {

// bench_torch.py and the config as a JSON file for it (a temporary file,
// removed when this goes).
class TorchBaseline {
 public:
  // Finds bench_torch.py: under the current folder (./remat runs from the
  // repository root), else next to the binary or one folder above it (the GPU
  // bundle); Error naming the places looked at if none has it.
  explicit TorchBaseline(const ModelConfig& c);
  ~TorchBaseline();
  TorchBaseline(const TorchBaseline&) = delete;
  TorchBaseline& operator=(const TorchBaseline&) = delete;

  // One PyTorch process ($REMAT_PYTHON, else /usr/bin/python3) with the
  // bench's threads, dtype, device, warm-up and timed steps: its numeric
  // result fields, step_ms_best its fastest timed step. Error, with its
  // output, if it fails or lacks a field.
  std::map<std::string, double> run(int threads, const std::string& dtype, const std::string& device,
                                    std::int64_t warmup, std::int64_t steps);
  // The framework the last run named ("" before one).
  const std::string& framework() const { return framework_; }

 private:
  std::string script_, config_path_, framework_;
};

}  // namespace remat::tools
