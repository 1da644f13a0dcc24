// Helpers the train/ tests share (scratch folders and file reads/writes are
// tests/files.h): a small model whose runs take well under a second a step.
#pragma once

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/files.h"
#include "train/trainer.h"

namespace remat::test {

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
