// Helpers the train/ tests share: scratch folders, whole-file reads and
// writes, and a small model whose runs take well under a second a step.
#pragma once

#include <catch2/catch.hpp>

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "train/trainer.h"

namespace remat::test {

// A fresh folder /tmp/remat-<tag>-XXXXXX, removed when the test binary exits.
inline std::string temp_dir(const std::string& tag) {
  static struct Cleanup {
    std::vector<std::string> dirs;
    ~Cleanup() {
      for (const auto& d : dirs) std::filesystem::remove_all(d);
    }
  } cleanup;
  std::string tmpl = "/tmp/remat-" + tag + "-XXXXXX";
  REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
  cleanup.dirs.push_back(tmpl);
  return tmpl;
}

// The whole file at `path` (which must exist).
inline std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// Replaces the file at `path` with `bytes`.
inline void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  REQUIRE(out.good());
}

// A 2-layer, d=32 model on 4 x 16 tokens for `steps` steps, with dropout on
// (so a resume must restore the RNG state exactly too), no evaluation until
// the end, one evaluation batch.
inline TrainOptions small_options(std::int64_t steps) {
  TrainOptions o;
  o.config = ModelConfig::named("tiny");
  o.config.name = "test-small";
  o.config.d_model = 32;
  o.config.n_layers = 2;
  o.config.n_heads = 2;
  o.config.ffn = 64;
  o.config.seq = 16;
  o.config.batch = 4;
  o.config.dropout = 0.1;
  o.steps = steps;
  o.seed = 5;
  o.warmup = 5;
  o.eval_every = 0;
  o.eval_batches = 1;
  return o;
}

// Runs `t` to the end and returns each step's loss.
inline std::vector<double> losses_of(Trainer& t) {
  std::vector<double> out;
  t.run([&](const StepStats& s) { out.push_back(s.loss); });
  return out;
}

}  // namespace remat::test
