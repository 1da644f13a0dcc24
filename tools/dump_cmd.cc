#include <cstdio>
#include <optional>

#include "engine/autograd.h"
#include "engine/parallel_for.h"
#include "tools/args.h"
#include "tools/auto_plan_flags.h"
#include "tools/commands.h"
#include "train/data.h"
#include "train/hf_model.h"
#include "train/safetensors.h"
#include "models/decoder.h"
#include "models/recompute.h"

namespace remat::tools {

int run_dump(const std::vector<std::string>& args) {
  Flags f("dump", "one deterministic forward/backward written to safetensors", args,
          with_auto_plan_flags({text_flag("config", "model config name or FILE.json", "tiny"),
           text_flag("model", "a Hugging Face model folder (config.json and safetensors weights) instead of "
                     "--config: its weights, and a batch of token ids drawn uniformly from its vocabulary"),
           int_flag("batch", "sequences in the batch (default: the config's; 1 with --model)", std::nullopt, {.min = 1}),
           int_flag("seq", "tokens per sequence (default: the config's; 64 with --model)", std::nullopt, {.min = 1}),
           int_flag("seed", "seed for weights and the batch", 0, {.min = 0}),
           text_flag("load", "take weights from this safetensors file (Hugging Face names)"),
           text_flag("recompute", "recompute plan", "none"),
           text_flag("offload-dir", "directory for the offload plans' spill file (default: $TMPDIR or /tmp)"),
           text_flag("dtype", "compute dtype: f32 or bf16 (parameters, gradients and the loss stay f32)", "f32"),
           text_flag("device", "cpu, cuda or cuda:N", "cpu"),
           text_flag("out", "output FILE.safetensors (required)"),
           threads_flag_spec()}));
  apply_threads_flag(f);
  REMAT_CHECK(f.has("out"), Error, "dump: --out FILE.safetensors is required");
  const std::string hf_dir = f.get("model");
  REMAT_CHECK(hf_dir.empty() || (!f.has("config") && !f.has("load")), Error,
              "dump: --model DIR brings its own config and weights; drop --config / --load");
  ModelConfig c = hf_dir.empty() ? ModelConfig::load(f.get("config")) : load_hf_config(hf_dir).config;
  if (!hf_dir.empty()) c.batch = 1, c.seq = 64;
  if (f.has("batch")) c.batch = f.get_int("batch");
  if (f.has("seq")) c.seq = f.get_int("seq");
  c.validate();
  const auto seed = std::uint64_t(f.get_int("seed"));
  const Device device = device_flag(f);
  const std::string plan = resolve_recompute(f, f.get("recompute"), c, f.get("dtype"), device, seed);
  RecomputePlan parsed = RecomputePlan::parse(plan, c.n_layers);
  if (f.has("offload-dir")) parsed.offload_dir = f.get("offload-dir");

  manual_seed(seed);
  std::optional<SkipWeightInit> loaded_next;  // --model: every parameter is read from the folder
  if (!hf_dir.empty()) loaded_next.emplace();
  DecoderModel model(c, seed);
  loaded_next.reset();
  model.set_compute_dtype(compute_dtype_from_name(f.get("dtype")));
  apply_recompute_plan(model, parsed);
  if (!hf_dir.empty()) load_hf_weights(model, hf_dir);
  if (f.has("load")) {
    const std::string path = f.get("load");
    SafetensorsFile w = load_safetensors(path);
    for (const auto& [name, p] : model.named_parameters()) {
      auto it = w.tensors.find(name);
      REMAT_CHECK(it != w.tensors.end(), IOError, "--load: ", path, " has no tensor '", name, "'");
      REMAT_CHECK(it->second.sizes() == p.sizes(), IOError, "--load: tensor '", name, "' in ", path, " is ",
                  shape_str(it->second.sizes()), ", the model needs ", shape_str(p.sizes()));
    }
    NoGradGuard ng;
    for (auto& [name, p] : model.named_parameters()) {
      Tensor dst = p;
      dst.copy_(w.tensors.at(name).to(DType::f32));
    }
  }
  // The batch: the generated corpus and sampler, both from the seed (a
  // Hugging Face model: ids uniform over its vocabulary, from the seed).
  Tensor tokens;
  if (hf_dir.empty()) {
    Corpus corpus = generated_corpus(seed, std::int64_t(1) << 18, c.seq + 2);
    BatchSampler sampler(corpus.train, c.batch, c.seq, seed + 1);
    tokens = sampler.next();
  } else {
    tokens = uniform_token_ids(c.batch, c.seq + 1, c.vocab, seed + 1);
  }
  // On a GPU: the same weights (drawn on the CPU) and batch, moved over.
  model.to(device);

  auto out = model.forward_loss(tokens.to(device));
  out.loss.backward();

  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, p] : model.named_parameters()) tensors.emplace_back(name, p.detach().to(kCPU));
  tensors.emplace_back("batch.tokens", tokens);
  tensors.emplace_back("loss.ce", out.ce.detach().to(kCPU));
  tensors.emplace_back("loss.aux", out.aux.detach().to(kCPU));
  // A parameter the batch did not reach (an expert no token was routed to)
  // has a zero gradient.
  for (const auto& [name, p] : model.named_parameters())
    tensors.emplace_back("grad." + name, p.grad().defined() ? p.grad().to(kCPU) : zeros(p.sizes()));
  std::map<std::string, std::string> meta = {{"config", c.to_json().dump()}, {"seed", std::to_string(seed)},
                                             {"recompute", plan}, {"device", device.str()}};
  if (!hf_dir.empty()) meta["model"] = hf_dir;
  save_safetensors(f.get("out"), tensors, meta);
  std::printf("dump: %s  loss.ce %.6f  loss.aux %.6f  (%zu tensors)\n", f.get("out").c_str(),
              out.ce.item(), out.aux.item(), tensors.size());
  return 0;
}

}  // namespace remat::tools
