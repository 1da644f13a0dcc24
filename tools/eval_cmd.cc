// ./remat eval: the validation loss and perplexity of a trained state on its
// data's held-out split (or another --data), as train's evaluations compute
// them.
#include <cmath>
#include <cstdio>
#include <fstream>

#include "engine/error.h"
#include "engine/json.h"
#include "engine/parallel_for.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "tools/fine_tune_flags.h"
#include "tools/json.h"
#include "train/hf_model.h"
#include "train/trainer.h"

namespace remat::tools {

int run_eval(const std::vector<std::string>& args) {
  Flags f("eval", "validation loss and perplexity of a training state", args,
          {text_flag("resume", "the training state folder (this or --model)"),
           text_flag("model", "a Hugging Face model folder (config.json, safetensors weights); needs --data"),
           adapter_flag_spec(),
           text_flag("data", "held-out data: token shards or a text file (default: the state's own data)"),
           int_flag("batch", "with --model: sequences per batch", 8, {.min = 1}),
           int_flag("seq", "with --model: tokens per sequence", 128, {.min = 1}),
           int_flag("batches", "held-out batches", 8, {.min = 1}),
           text_flag("json", "also write the result as JSON to FILE ('-': stdout, instead of the text line)"),
           threads_flag_spec()});
  apply_threads_flag(f);
  REMAT_CHECK(f.has("resume") != f.has("model"), Error,
              "eval: give one of --resume DIR (a folder written by train --save) or --model DIR (a Hugging Face "
              "model folder, with --data)");
  std::map<std::string, std::string> meta;
  TrainOptions o;
  const std::string source = f.has("model") ? f.get("model") : f.get("resume");
  if (f.has("model")) {
    REMAT_CHECK(f.has("data"), Error, "eval: --model needs --data (token shards made with its tokenizer, or text)");
    o.config = load_hf_config(f.get("model")).config;
    o.config.batch = f.get_int("batch");
    o.config.seq = f.get_int("seq");
    o.init_model = f.get("model");
    o.adapter = apply_adapter_flag(f, o.config);
  } else {
    REMAT_CHECK(!f.has("adapter"), Error, "eval: --adapter goes with --model BASE (a state holds its own adapters)");
    load_trained_model(f.get("resume"), &meta);  // checks the state (checksums, parameters) and reads its metadata
    o.config = ModelConfig::from_json(Json::parse(meta.at("config"), "the state's config"));
    o.resume_dir = f.get("resume");
  }
  const std::string data = f.has("data") ? f.get("data") : meta.count("data") ? meta.at("data") : "generated";
  o.data_file = data == "generated" ? "" : data;
  if (meta.count("seed")) o.seed = std::stoull(meta.at("seed"));
  o.eval_batches = f.get_int("batches");
  o.steps = std::max<std::int64_t>(1, meta.count("step") ? std::stoll(meta.at("step")) : 1);
  Trainer trainer(o);
  const double loss = trainer.evaluate();
  const double ppl = std::exp(loss);
  const double tokens = double(o.eval_batches * o.config.batch * o.config.seq);
  JsonObject j;
  j.set("state", source).set("step", trainer.step()).set("data", data).set("val_loss", loss);
  j.set("perplexity", ppl).set("tokens", tokens);
  const std::string json_path = f.get("json");
  if (json_path == "-") {
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf("eval: %s at step %lld on %s: val loss %.4f, perplexity %.2f (%.0f tokens)\n", source.c_str(),
                static_cast<long long>(trainer.step()), data.c_str(), loss, ppl, tokens);
    if (!json_path.empty()) {
      std::ofstream out(json_path);
      REMAT_CHECK(out.good(), IOError, "eval: cannot write ", json_path);
      out << j.str() << "\n";
    }
  }
  return 0;
}

}  // namespace remat::tools
