// ./remat dump: one deterministic forward/backward of a model, its
// parameters, batch, loss terms and gradients written to safetensors.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>

#include "engine/autograd.h"
#include "engine/parallel_for.h"
#include "checkpoint/dynamic_remat.h"
#include "checkpoint/checkpoint.h"
#include "moe/dispatch.h"
#include "ops/linear_cross_entropy.h"
#include "tools/args.h"
#include "tools/fine_tune_flags.h"
#include "tools/auto_plan_flags.h"
#include "tools/commands.h"
#include "tools/json.h"
#include "train/data.h"
#include "train/adapter_files.h"
#include "train/hf_model.h"
#include "train/safetensors.h"
#include "models/block_stack.h"
#include "models/decoder.h"
#include "models/recompute.h"

namespace remat::tools {

namespace {

std::vector<FlagSpec> dump_flag_specs() {
  return with_auto_plan_flags(
      {text_flag("config", "model config name or FILE.json", "tiny"),
       text_flag("model", "a Hugging Face model folder (config.json and safetensors weights) instead of "
                 "--config: its weights, and a batch of token ids drawn uniformly from its vocabulary"),
       int_flag("batch", "sequences in the batch (default: the config's; 1 with --model)", std::nullopt, {.min = 1}),
       int_flag("seq", "tokens per sequence (default: the config's; 64 with --model)", std::nullopt, {.min = 1}),
       int_flag("seed", "seed for weights and the batch", 0, {.min = 0}),
       text_flag("load", "take weights from this safetensors file (Hugging Face names; with --model: over the "
                 "folder's, e.g. a training state's state.safetensors)"),
       text_flag("recompute", "recompute plan", "none"),
       text_flag("offload-dir", "directory for the offload plans' spill file (default: $TMPDIR or /tmp)"),
       text_flag("dtype", "compute dtype: f32 or bf16 (parameters, gradients and the loss stay f32)", "f32"),
       text_flag("device", "cpu, cuda, cuda:N, or meta (shapes and saved bytes only, to FILE.json)", "cpu"),
       meta_kernels_flag_spec(),
       text_flag("out", "output FILE.safetensors, or FILE.json on meta (required)"),
       threads_flag_spec(), fine_tune_flag_specs()[0], fine_tune_flag_specs()[1], adapter_flag_spec()});
}

// The config: --config's, or the Hugging Face folder's (batch 1 x 64 tokens),
// with --batch and --seq applied.
ModelConfig dump_config(const Flags& f, const std::string& hf_dir) {
  ModelConfig c = hf_dir.empty() ? ModelConfig::load(f.get("config")) : load_hf_config(hf_dir).config;
  if (!hf_dir.empty()) c.batch = 1, c.seq = 64;
  if (f.has("batch")) c.batch = f.get_int("batch");
  if (f.has("seq")) c.seq = f.get_int("seq");
  apply_fine_tune_flags(f, c);
  apply_adapter_flag(f, c);  // (its tensors are loaded after the folder's weights)
  c.validate();
  return c;
}

// --load: every parameter from the safetensors file at `path` (checked for
// presence and shape before any is copied).
void load_weights(DecoderModel& model, const std::string& path) {
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
Tensor dump_batch(const ModelConfig& c, std::uint64_t seed, bool hf) {
  if (!hf) {
    Corpus corpus = generated_corpus(seed, std::int64_t(1) << 18, c.seq + 2);
    BatchSampler sampler(corpus.train, c.batch, c.seq, seed + 1);
    return sampler.next();
  }
  return uniform_token_ids(c.batch, c.seq + 1, c.vocab, seed + 1);
}

// What the file holds: the parameters, the batch, the loss terms and the
// gradients of those that train (zero for a parameter the batch did not
// reach, e.g. an expert no token was routed to), where they are (`to_host`:
// all on the CPU).
std::vector<std::pair<std::string, Tensor>> dump_tensors(const DecoderModel& model, const Tensor& tokens,
                                                         const DecoderModel::Output& out, bool to_host = true) {
  auto host = [&](const Tensor& t) { return to_host ? t.to(kCPU) : t; };
  std::vector<std::pair<std::string, Tensor>> tensors;
  // (a frozen bf16 / f16 parameter as f32: its exact values)
  for (const auto& [name, p] : model.named_parameters()) tensors.emplace_back(name, host(p.detach().to(DType::f32)));
  tensors.emplace_back("batch.tokens", tokens);
  tensors.emplace_back("loss.ce", host(out.ce.detach()));
  tensors.emplace_back("loss.aux", host(out.aux.detach()));
  for (const auto& [name, p] : model.trainable_parameters())  // (a frozen parameter has none)
    tensors.emplace_back("grad." + name, p.grad().defined() ? host(p.grad())
                                                            : zeros(p.sizes(), TensorOptions(DType::f32, p.device())));
  return tensors;
}

// What the model's recompute plan did in one forward/backward, from the
// counters of this thread and the block stack's hooks.
struct PlanEffects {
  std::int64_t recomputed_ops = 0;           // ops dispatched inside replays
  std::int64_t offloaded_bytes = 0;          // bytes of the saves the offload hooks took
  std::int64_t compressed_saved_bytes = 0;   // bytes the compressed saves kept
  std::int64_t replayed_dispatch_bytes = 0;  // MoE dispatch/combine bytes moved again in replays

  // The counters now (the hooks' totals since the plan was set).
  static PlanEffects now(const BlockStack& blocks) {
    PlanEffects e;
    e.recomputed_ops = checkpoint_counters().ops_recomputed;
    // Taken, not written: a save that backward needs before the writer
    // reaches it is never written, and when that happens depends on timing.
    if (const auto& off = blocks.offload_hooks()) e.offloaded_bytes = off->stats().bytes_taken;
    if (const auto& comp = blocks.compress_hooks()) e.compressed_saved_bytes = comp->stats().compressed_bytes;
    e.replayed_dispatch_bytes = dispatch_counters().replay_bytes_moved;
    return e;
  }
  PlanEffects operator-(const PlanEffects& o) const {
    return {recomputed_ops - o.recomputed_ops, offloaded_bytes - o.offloaded_bytes,
            compressed_saved_bytes - o.compressed_saved_bytes, replayed_dispatch_bytes - o.replayed_dispatch_bytes};
  }
};

DynamicRematStats dynamic_stats(const DecoderModel& model) {
  const auto& dyn = model.block_stack().dynamic_remat();
  return dyn ? dyn->stats() : DynamicRematStats{};
}

// dynamic with --memory-budget N%: one forward and backward of `tokens` under
// plan none first (the generator put back after it) measures the bytes this
// dump holds besides activations (the model, its gradients) and none's peak;
// the budget is those bytes plus N% of the peak above them. (train's N% is
// of a profiled training step's, whose persistent bytes hold the optimizer
// state too: docs/RECOMPUTE.md#dynamic.)
std::int64_t measure_dynamic_budget(DecoderModel& model, const Tensor& tokens, const std::string& text) {
  const RecomputePlan keep = model.block_stack().plan();
  apply_recompute_plan(model, RecomputePlan::parse("none", model.config().n_layers));
  Generator& gen = default_generator(tokens.device());
  const RngState rng = gen.state();
  CachingAllocator& alloc = allocator_for(tokens.device());
  alloc.reset_peak();
  {
    auto out = model.forward_loss(tokens);
    out.loss.backward();
  }
  const std::int64_t peak = alloc.stats().allocated_peak, base = alloc.stats().allocated_bytes;
  for (Tensor p : model.parameters()) p.set_grad(Tensor());  // the dumped pass makes its own
  gen.set_state(rng);
  apply_recompute_plan(model, keep);
  const double share = std::stod(text.substr(0, text.size() - 1));
  REMAT_CHECK(share > 0, Error, "--memory-budget ", text, ": expected a share above 0%");
  const auto budget = std::int64_t(double(base) + share / 100.0 * double(peak - base));
  std::printf("dump: dynamic budget %s: %.1f MiB (%.1f MiB besides activations, none's peak %.1f MiB)\n", text.c_str(),
              double(budget) / 1048576.0, double(base) / 1048576.0, double(peak) / 1048576.0);
  return budget;
}

// The dump's metadata: what ran (config, seed, the plan asked for and the
// plan the model ran, canonical), what the plan did, and the routers' drops
// and z-loss (docs/REFERENCE.md).
std::map<std::string, std::string> dump_metadata(const ModelConfig& c, std::uint64_t seed, const std::string& plan,
                                                 const DecoderModel& model, const PlanEffects& did,
                                                 const DecoderModel::Output& out, const Device& device) {
  std::int64_t dropped = 0;
  double z = 0;
  for (const MoELayerStats& r : out.routing) dropped += r.dropped, z += r.z;
  return {{"config", c.to_json().dump()},
          {"seed", std::to_string(seed)},
          {"recompute", plan},
          {"recompute_plan", model.block_stack().plan().str()},
          {"recomputed_ops", std::to_string(did.recomputed_ops)},
          {"offloaded_bytes", std::to_string(did.offloaded_bytes)},
          {"compressed_saved_bytes", std::to_string(did.compressed_saved_bytes)},
          {"replayed_dispatch_bytes", std::to_string(did.replayed_dispatch_bytes)},
          {"moe_dropped", std::to_string(dropped)},
          {"moe_z_loss", Json::format_number(z)},
          {"loss_chunk_tile", std::to_string(loss_chunk_tile(device))},
          {"device", device.str()}};
}

// --device meta: the same forward and backward on shapes alone (a Hugging
// Face folder read for its config.json and headers only); FILE.json gets
// what shapes decide: every tensor the safetensors dump would hold (name,
// dtype, shape, bytes), the bytes held for backward at the forward's end by
// op, the plan's effects and the allocator's peak (docs/META.md).
int dump_meta(const Flags& f, const ModelConfig& c, std::uint64_t seed, const std::string& plan,
              const RecomputePlan& parsed, const std::string& hf_dir) {
  const std::string out_path = f.get("out");
  REMAT_CHECK(out_path.size() > 5 && out_path.compare(out_path.size() - 5, 5, ".json") == 0, Error,
              "dump: --device meta has no values to write: it writes shapes and saved bytes to --out FILE.json, got '",
              out_path, "'");
  REMAT_CHECK(!f.has("load"), DeviceError, "dump: --load reads a file's values, which meta cannot hold; use --model "
              "DIR (read for its config.json and headers only) or --config");
  std::ofstream file(out_path);
  REMAT_CHECK(file.good(), IOError, "dump: cannot write ", out_path);
  manual_seed(seed);
  std::unique_ptr<DecoderModel> model;
  {
    DefaultDeviceScope on(kMeta);
    std::optional<SkipWeightInit> loaded_next;
    if (!hf_dir.empty()) loaded_next.emplace();
    model = std::make_unique<DecoderModel>(c, seed);
  }
  model->set_compute_dtype(compute_dtype_from_name(f.get("dtype")));
  apply_recompute_plan(*model, parsed);
  if (!hf_dir.empty()) load_hf_weights(*model, hf_dir);
  if (f.has("adapter")) load_adapter(*model, f.get("adapter"));  // (on meta: names and shapes checked)
  CachingAllocator& alloc = allocator_for(kMeta);
  alloc.reset_peak();
  const Tensor tokens = empty({c.batch, c.seq + 1}, TensorOptions(DType::i64, kMeta));
  const PlanEffects before = PlanEffects::now(model->block_stack());
  auto out = model->forward_loss(tokens);
  const SavedBytesReport held = saved_bytes_report();
  out.loss.backward();
  const PlanEffects did = PlanEffects::now(model->block_stack()) - before;

  std::string tensors = "[";
  std::int64_t count = 0;
  for (const auto& [name, t] : dump_tensors(*model, tokens, out, false)) {
    tensors += std::string(count++ ? ",\n  " : "\n  ") +
               JsonObject().set("name", name).set("dtype", dtype_name(t.dtype())).set_raw("shape", [&] {
                 std::string sh = "[";
                 for (std::int64_t d = 0; d < t.dim(); ++d) sh += (d ? ", " : "") + std::to_string(t.size(d));
                 return sh + "]";
               }()).set("bytes", std::int64_t(t.nbytes())).str();
  }
  tensors += "\n]";
  JsonObject by_op;
  for (const auto& [op, bytes] : held.bytes_by_op) by_op.set(op, bytes);
  JsonObject doc;
  doc.set("format", "remat-dump-meta-1");
  for (const auto& [k, v] : dump_metadata(c, seed, plan, *model, did, out, kMeta)) {
    if (k == "moe_dropped" || k == "moe_z_loss") continue;  // (values meta does not have)
    const bool number = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
    if (k == "config" || number)
      doc.set_raw(k, v);
    else
      doc.set(k, v);
  }
  if (!hf_dir.empty()) doc.set("model", hf_dir);
  doc.set("saved_after_forward_bytes", held.live_bytes)
      .set_raw("saved_after_forward_by_op", by_op.str())
      .set("peak_allocated_bytes", alloc.stats().allocated_peak)
      .set_raw("tensors", tensors);
  file << doc.str() << "\n";
  file.close();
  REMAT_CHECK(file.good(), IOError, "dump: writing ", out_path, " failed");
  std::printf("dump: %s  meta: shapes only, %lld tensors, %s held for backward after the forward, peak %s\n",
              out_path.c_str(), static_cast<long long>(count), format_bytes(held.live_bytes).c_str(),
              format_bytes(alloc.stats().allocated_peak).c_str());
  return 0;
}

}  // namespace

int run_dump(const std::vector<std::string>& args) {
  Flags f("dump", "one deterministic forward/backward written to safetensors", args, dump_flag_specs());
  apply_threads_flag(f);
  REMAT_CHECK(f.has("out"), Error, "dump: --out FILE.safetensors is required");
  const std::string hf_dir = f.get("model");
  REMAT_CHECK(hf_dir.empty() || !f.has("config"), Error, "dump: --model DIR brings its own config; drop --config");
  const ModelConfig c = dump_config(f, hf_dir);
  const auto seed = std::uint64_t(f.get_int("seed"));
  const Device device = device_flag(f, true);
  // dynamic with an N% budget: N% of this dump's own none pass (measure_dynamic_budget).
  const RecomputePlan asked =
      f.get("recompute") == "auto" ? RecomputePlan{} : RecomputePlan::parse(f.get("recompute"), c.n_layers);
  const bool dynamic_share = asked.dynamic && asked.dynamic_budget == 0 && f.has("memory-budget") &&
                             !f.get("memory-budget").empty() && f.get("memory-budget").back() == '%';
  const std::string plan =
      dynamic_share ? f.get("recompute") : resolve_recompute(f, f.get("recompute"), c, f.get("dtype"), device, seed);
  RecomputePlan parsed = RecomputePlan::parse(plan, c.n_layers);
  if (f.has("offload-dir")) parsed.offload_dir = f.get("offload-dir");
  if (device.is_meta()) return dump_meta(f, c, seed, plan, parsed, hf_dir);

  manual_seed(seed);
  std::optional<SkipWeightInit> loaded_next;  // --model: every parameter is read from the folder
  if (!hf_dir.empty()) loaded_next.emplace();
  DecoderModel model(c, seed);
  loaded_next.reset();
  model.set_compute_dtype(compute_dtype_from_name(f.get("dtype")));
  apply_recompute_plan(model, parsed);
  if (!hf_dir.empty()) load_hf_weights(model, hf_dir);
  if (f.has("adapter")) load_adapter(model, f.get("adapter"));
  if (f.has("load")) load_weights(model, f.get("load"));
  const Tensor tokens = dump_batch(c, seed, !hf_dir.empty());
  // On a GPU: the same weights (drawn on the CPU) and batch, moved over.
  model.to(device);

  if (dynamic_share) {
    parsed.dynamic_budget = measure_dynamic_budget(model, tokens.to(device), f.get("memory-budget"));
    apply_recompute_plan(model, parsed);
  }

  CachingAllocator& alloc = allocator_for(device);
  alloc.reset_peak();
  const PlanEffects before = PlanEffects::now(model.block_stack());
  const DynamicRematStats dyn_before = dynamic_stats(model);
  DecoderModel::Output out;
  {
    const DynamicRematScope dynamic(model.block_stack().dynamic_remat());
    out = model.forward_loss(tokens.to(device));
    out.loss.backward();
  }
  const PlanEffects did = PlanEffects::now(model.block_stack()) - before;
  const std::int64_t peak = alloc.stats().allocated_peak;

  const auto tensors = dump_tensors(model, tokens, out);
  std::map<std::string, std::string> meta = dump_metadata(c, seed, plan, model, did, out, device);
  if (const auto& dyn = model.block_stack().dynamic_remat()) {
    const DynamicRematStats d = dynamic_stats(model);
    meta["memory_budget_bytes"] = std::to_string(dyn->options().budget);
    meta["peak_allocated_bytes"] = std::to_string(peak);
    meta["evictions"] = std::to_string(d.evictions - dyn_before.evictions);
    meta["rebuilds"] = std::to_string(d.rebuilds - dyn_before.rebuilds);
  }
  if (!hf_dir.empty()) meta["model"] = hf_dir;
  save_safetensors(f.get("out"), tensors, meta);
  std::printf("dump: %s  loss.ce %.6f  loss.aux %.6f  (%zu tensors)\n", f.get("out").c_str(),
              out.ce.item(), out.aux.item(), tensors.size());
  return 0;
}

}  // namespace remat::tools
