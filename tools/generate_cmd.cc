// ./remat generate: text from a trained state, sampled with the KV cache
// (models/generate.h), streamed to stdout as the tokens come.
#include <cstdio>

#include "engine/error.h"
#include "engine/parallel_for.h"
#include "models/generate.h"
#include "tokenizer/tokenizer.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "tools/fine_tune_flags.h"
#include "train/adapter_files.h"
#include "train/hf_model.h"
#include "train/trainer.h"

namespace remat::tools {

int run_generate(const std::vector<std::string>& args) {
  Flags f("generate", "sample text from a training state with a KV cache", args,
          {text_flag("resume", "the training state folder (this or --model)"),
           text_flag("model", "a Hugging Face model folder (config.json, safetensors weights; its tokenizer by default)"),
           adapter_flag_spec(),
           text_flag("tokenizer", "tokenizer.json, tokenizer.model or a folder with one (default: the one the state "
                     "was trained with)"),
           text_flag("prompt", "the text to continue (required)"),
           int_flag("max-new", "tokens to generate", 64, {.min = 0}),
           number_flag("temperature", "sampling temperature (0: greedy)", 0.8, {.min = 0}),
           int_flag("top-k", "sample from the K most likely tokens (0: all)", 0, {.min = 0}),
           number_flag("top-p", "sample from the smallest set of tokens whose probability reaches P", 1.0,
                       {.min = 0, .min_open = true, .max = 1}),
           int_flag("seed", "the sampling stream", 0, {.min = 0}),
           bool_flag("no-stop", "keep going after the tokenizer's EOS"),
           threads_flag_spec()});
  apply_threads_flag(f);
  REMAT_CHECK(f.has("resume") != f.has("model"), Error,
              "generate: give one of --resume DIR (a folder written by train --save) or --model DIR (a Hugging Face "
              "model folder)");
  REMAT_CHECK(f.has("prompt"), Error, "generate: --prompt TEXT is required");
  std::map<std::string, std::string> meta;
  std::unique_ptr<DecoderModel> model;
  REMAT_CHECK(!f.has("adapter") || f.has("model"), Error,
              "generate: --adapter goes with --model BASE (a state holds its own adapters)");
  if (f.has("model")) {
    ModelConfig adapted;  // (its lora: the adapter's, if any)
    const std::string adapter = apply_adapter_flag(f, adapted);
    model = load_hf_model(f.get("model"), 1, 1, kCPU, adapted.lora);
    if (!adapter.empty()) load_adapter(*model, adapter);
    model->train(false);
    if (has_tokenizer_files(f.get("model"))) meta["tokenizer"] = f.get("model");
  } else {
    model = load_trained_model(f.get("resume"), &meta);
  }
  const std::string source = f.has("model") ? f.get("model") : f.get("resume");
  std::string tok_path = f.get("tokenizer");
  if (tok_path.empty() && meta.count("tokenizer")) tok_path = meta.at("tokenizer");
  REMAT_CHECK(!tok_path.empty(), Error, "generate: ", source,
              " names no tokenizer (a state trained on bytes, or a model folder without tokenizer files); give --tokenizer");
  const auto tok = load_tokenizer(tok_path);
  REMAT_CHECK(tok->vocab_size() <= model->config().vocab, Error, "generate: tokenizer ", tok_path, " has ",
              tok->vocab_size(), " tokens, the model's vocabulary ", model->config().vocab);
  const std::vector<std::int32_t> prompt = tok->encode(f.get("prompt"));
  REMAT_CHECK(!prompt.empty(), Error, "generate: the prompt encodes to no tokens");
  GenerateOptions o;
  o.max_new = f.get_int("max-new");
  o.temperature = f.get_double("temperature");
  o.top_k = f.get_int("top-k");
  o.top_p = f.get_double("top-p");
  o.seed = std::uint64_t(f.get_int("seed"));
  if (!f.get_bool("no-stop")) o.stop = tok->eos_id();
  // Stream: print what decoding the tokens so far adds, holding back an
  // incomplete UTF-8 character (a byte-level token may end mid-character).
  std::vector<std::int32_t> out;
  std::size_t printed = 0;
  std::fputs(f.get("prompt").c_str(), stdout);
  auto flush_text = [&](bool final) {
    const std::string text = tok->decode(out);
    std::size_t end = text.size();
    if (!final) {
      const std::string repl = "\xEF\xBF\xBD";  // U+FFFD: bytes still to come
      while (end >= printed + 3 && text.compare(end - 3, 3, repl) == 0) end -= 3;
    }
    if (end > printed) {
      std::fwrite(text.data() + printed, 1, end - printed, stdout);
      std::fflush(stdout);
      printed = end;
    }
  };
  generate(*model, prompt, o, [&](std::int32_t t) {
    if (o.stop && t == *o.stop) return;
    out.push_back(t);
    flush_text(false);
  });
  flush_text(true);
  std::printf("\n");
  return 0;
}

}  // namespace remat::tools
