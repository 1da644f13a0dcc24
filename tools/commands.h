// The CLI's commands (each returns the process exit status).
#pragma once

#include <string>
#include <vector>

#include "train/train_options.h"

namespace remat::tools {

// The options `./remat train ARGS` would train with: the same flags,
// defaults and errors (Error naming a bad flag or value), --model's config,
// --recompute auto resolved by the planner, --threads applied. For programs
// that drive the Trainer themselves (the Python module); the flags that act
// only after training (--save-hf, --save-adapter, --log, --progress) are
// an Error there.
TrainOptions train_options_from_args(const std::vector<std::string>& args);

// ./remat train: trains a model, showing progress; see
// docs/REFERENCE.md#command-line.
int run_train(const std::vector<std::string>& args);
// ./remat dump: one deterministic forward/backward written to safetensors.
int run_dump(const std::vector<std::string>& args);
// ./remat mem: the allocator history over one training step as JSON and HTML.
int run_mem(const std::vector<std::string>& args);
// ./remat bench: plans x repeats in fresh processes; table and --json.
int run_bench(const std::vector<std::string>& args);
// ./remat plan: the plan --recompute auto chooses for a memory budget.
int run_plan(const std::vector<std::string>& args);
// ./remat tokenize: text to token shards, ids as JSON, or ids to text.
int run_tokenize(const std::vector<std::string>& args);
// ./remat eval: validation loss and perplexity of a training state.
int run_eval(const std::vector<std::string>& args);
// ./remat generate: sampled text from a training state (KV cache).
int run_generate(const std::vector<std::string>& args);
// ./remat export: a training state as a Hugging Face model folder.
int run_export(const std::vector<std::string>& args);
// ./remat ops: the op table, as a table or markdown.
int run_ops(const std::vector<std::string>& args);
// The per-process measurement ./remat bench starts (internal).
int run_bench_worker(const std::vector<std::string>& args);

}  // namespace remat::tools
