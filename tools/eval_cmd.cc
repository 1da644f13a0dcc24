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
#include "tools/json.h"
#include "train/trainer.h"

namespace remat::tools {

int run_eval(const std::vector<std::string>& args) {
  Flags f("eval", "validation loss and perplexity of a training state", args,
          {text_flag("resume", "the training state folder (required)"),
           text_flag("data", "held-out data: token shards or a text file (default: the state's own data)"),
           int_flag("batches", "held-out batches", 8, {.min = 1}),
           text_flag("json", "also write the result as JSON to FILE ('-': stdout, instead of the text line)"),
           threads_flag_spec()});
  apply_threads_flag(f);
  REMAT_CHECK(f.has("resume"), Error, "eval: --resume DIR is required (a folder written by train --save)");
  std::map<std::string, std::string> meta;
  load_trained_model(f.get("resume"), &meta);  // checks the state (checksums, parameters) and reads its metadata
  TrainOptions o;
  o.config = ModelConfig::from_json(Json::parse(meta.at("config"), "the state's config"));
  const std::string data = f.has("data") ? f.get("data") : meta.count("data") ? meta.at("data") : "generated";
  o.data_file = data == "generated" ? "" : data;
  if (meta.count("seed")) o.seed = std::stoull(meta.at("seed"));
  o.resume_dir = f.get("resume");
  o.eval_batches = f.get_int("batches");
  o.steps = std::max<std::int64_t>(1, meta.count("step") ? std::stoll(meta.at("step")) : 1);
  Trainer trainer(o);
  const double loss = trainer.evaluate();
  const double ppl = std::exp(loss);
  const double tokens = double(o.eval_batches * o.config.batch * o.config.seq);
  JsonObject j;
  j.set("state", f.get("resume")).set("step", trainer.step()).set("data", data).set("val_loss", loss);
  j.set("perplexity", ppl).set("tokens", tokens);
  const std::string json_path = f.get("json");
  if (json_path == "-") {
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf("eval: %s at step %lld on %s: val loss %.4f, perplexity %.2f (%.0f tokens)\n", f.get("resume").c_str(),
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
