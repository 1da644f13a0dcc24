#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>

#include "engine/parallel_for.h"
#include "tools/args.h"
#include "tools/fine_tune_flags.h"
#include "tokenizer/tokenizer.h"
#include "tools/auto_plan_flags.h"
#include "tools/html.h"
#include "tools/commands.h"
#include "tools/progress.h"
#include "train/adapter_files.h"
#include "train/hf_model.h"
#include "train/state_files.h"
#include "train/trainer.h"

namespace remat::tools {

namespace {
std::string hms(double s) {
  char buf[32];
  const int t = int(std::lround(s));
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%d:%02d:%02d", t / 3600, (t / 60) % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%d:%02d", t / 60, t % 60);
  return buf;
}

// Tests: REMAT_FAULT_SAVE=STEP[:N] ends this process with status 99 right
// after step STEP (train/state_files.h: begin, writing, written, rotated,
// renamed, synced) of its Nth save (default 1), as a crash would: nothing is
// flushed or cleaned up.
void install_save_fault_from_env() {
  const char* spec = std::getenv("REMAT_FAULT_SAVE");
  if (!spec || !*spec) return;
  const std::string s = spec;
  const auto colon = s.find(':');
  int nth = 1;
  SaveStep at = SaveStep::begin;
  try {
    at = parse_save_step(s.substr(0, colon));
    if (colon != std::string::npos) nth = std::stoi(s.substr(colon + 1));
  } catch (const std::exception& e) {
    throw Error("REMAT_FAULT_SAVE=" + s + ": expected STEP[:N]: " + e.what());
  }
  REMAT_CHECK(nth >= 1, Error, "REMAT_FAULT_SAVE=", s, ": N must be >= 1");
  auto saves = std::make_shared<int>(0);
  set_save_fault_hook([=](SaveStep step) {
    if (step == SaveStep::begin) ++*saves;
    if (*saves != nth || step != at) return;
    static const char msg[] = "remat: REMAT_FAULT_SAVE: ending the process in the middle of a save\n";
    if (::write(STDERR_FILENO, msg, sizeof msg - 1) < 0) {}
    ::_exit(99);
  });
}

// The model, data and schedule flags.
std::vector<FlagSpec> model_and_schedule_flags() {
  return {text_flag("config", "model config: tiny, tiny-moe, bench-dense, bench-moe or FILE.json", "tiny"),
    text_flag("model", "fine-tune a Hugging Face model folder (config.json and safetensors weights; Llama, Qwen2, "
              "Qwen2-MoE, Mixtral) instead of --config: its architecture and weights, a fresh optimizer"),
    text_flag("save-hf", "at the end, also write the model as a Hugging Face folder OUT (config.json, "
              "safetensors, the tokenizer's files)"),
    text_flag("hf-dtype", "weights dtype for --save-hf: f32, bf16 or f16 (default: the --model folder's, else f32)"),
    text_flag("save-adapter", "at the end, also write the LoRA adapters as a PEFT adapter folder OUT "
              "(adapter_config.json, adapter_model.safetensors; needs --model and --lora or --adapter)"),
    text_flag("adapter-dtype", "weights dtype for --save-adapter: f32, bf16 or f16", "f32"),
    adapter_flag_spec(),
    number_flag("max-shard-mb", "--save-hf: shard the weights into files of at most this many MB (10^6 bytes)",
                5000, {.min = 0, .min_open = true}),
    text_flag("data", "train on token shards (a folder or *.tok file from ./remat tokenize; the model's vocabulary "
              "becomes theirs) or a text file (byte level); the last 10% held out (of every shard). Default: "
              "the generated corpus"),
    text_flag("tokenizer", "the tokenizer the shards were made with (checked against them; recorded in saves "
              "for generate)"),
    int_flag("steps", "optimizer steps of the whole run", 600, {.min = 1}),
    int_flag("stop-after", "stop this invocation after N steps (resume later with --resume; 0: run to --steps)", 0,
             {.min = 0}),
    int_flag("seed", "seed for weights, data and dropout", 0, {.min = 0}),
    number_flag("lr", "peak learning rate", 3e-3, {.min = 0, .min_open = true}),
    int_flag("warmup", "warm-up steps", 20, {.min = 0}),
    number_flag("min-lr", "the schedule's floor (default: --lr / 10)", std::nullopt, {.min = 0}),
    text_flag("schedule", "learning rate after the warm-up: cosine or linear (to --min-lr at --steps), or "
              "constant", "cosine"),
    number_flag("weight-decay", "AdamW's decoupled weight decay", 0.1, {.min = 0}),
    number_flag("clip", "global gradient-norm clip (0: none)", 1.0, {.min = 0}),
    int_flag("batch", "sequences per optimizer step (default: the config's)", std::nullopt, {.min = 1}),
    int_flag("seq", "tokens per sequence (default: the config's)", std::nullopt, {.min = 1}),
    text_flag("seq-range", "MIN:MAX[:log]: each step's batch draws its sequence length from [MIN, MAX], uniformly "
              "or (:log) with P(S) ~ 1/S, most batches short (seeded: "
              "the same lengths on every run); the model is built for MAX (--seq, if given, must be MAX); "
              "evaluation stays at MAX; --log adds each step's `seq`"),
    int_flag("grad-accum", "micro-batches per step (gradients summed; the batch divides by ranks x N)", 1,
             {.min = 1}),
    int_flag("eval-batches", "held-out batches per evaluation", 8, {.min = 1})};
}

// The memory, precision, parallelism and output flags.
std::vector<FlagSpec> run_flags() {
  return {text_flag("recompute", "recompute plan: none, per_block, chunk, selected:I,J, uniform:N, block:N, attention, "
              "selective:NAMES, offload[:NAMES], compress:bf16|fp8[:NAMES], or A+B", "none"),
    text_flag("offload-dir", "directory for the offload plans' spill file (default: $TMPDIR or /tmp; the file "
              "is deleted at once and vanishes with the process)"),
    text_flag("save", "save state to DIR at the end (and every --save-every steps)"),
    int_flag("save-every", "save every N steps (0: only at the end)", 0, {.min = 0}),
    text_flag("resume", "resume from the state in DIR"),
    text_flag("log", "write one JSON object per step to FILE.jsonl"),
    int_flag("eval-every", "validation every N steps (0: only at the end)", 100, {.min = 0}),
    text_flag("dtype", "compute dtype: f32, bf16 (mixed precision: f32 master weights, optimizer state and loss) "
              "or f16 (the same, with dynamic loss scaling)", "f32"),
    text_flag("on-nonfinite", "a step whose loss or gradient norm is inf/NaN: stop (exit non-zero; nothing saved "
              "after the last good step) or skip (drop its update, retry the step on the next batch)", "stop"),
    int_flag("max-nonfinite-skips", "with --on-nonfinite skip: stop after N skipped steps in a row", 10,
             {.min = 1}),
    text_flag("device", "cpu, cuda or cuda:N: parameters, optimizer state and activations live there", "cpu"),
    int_flag("dp", "data parallel over N ranks (run under `mpirun -np N`; 0: the job's size)", 0, {.min = 0}),
    int_flag("ep", "expert parallel: split the routed experts over N ranks (N divides the job's size)", 1,
             {.min = 1}),
    int_flag("zero", "sharded data parallel over the --dp ranks: 1 shards the optimizer state and the update, 2 "
             "also the gradients (reduce-scattered per block), 3 also the parameters (gathered per block just in "
             "time); 0: none", 0, {.min = 0, .max = 3}),
    int_flag("pp", "pipeline parallel: split the blocks into N stages, one per rank (run under `mpirun -np N`, "
             "or N x D ranks for D data-parallel replicas of each stage); micro-batches from --grad-accum", 1,
             {.min = 1}),
    int_flag("tp", "tensor parallel: split every block's matmuls, the embedding and the LM head over N "
             "neighbouring ranks (the job is N x the data-parallel ranks)", 1, {.min = 1}),
    bool_flag("sp", "with --tp: sequence parallel, the norms, dropout and residual stream sharded along the sequence "
              "over the --tp ranks"),
    text_flag("pp-schedule", "with --pp: 1f1b (warm-up, one forward one backward, cool-down) or gpipe (all "
              "forwards, then all backwards)", "1f1b"),
    text_flag("pp-split", "with --pp: the first block of each stage after the first, e.g. 3,6 (default: "
              "balanced by parameter count)"),
    number_flag("bucket-mb", "data-parallel gradient bucket size in MiB", 25,
                {.min = 0, .min_open = true, .max = 1 << 20}),
    int_flag("reuse-routing", "1: recompute replays reuse the forward's exchanged expert counts; 0: exchange again",
             1, {.min = 0, .max = 1}),
    text_flag("progress", "per-step progress on stdout: bar (one line redrawn with \\r), lines (a line every "
              "10 steps and at each evaluation), off (none; the summary still prints), or auto (bar on a terminal "
              "not started by a launcher such as mpirun or srun, else lines)", "auto"),
    number_flag("comm-timeout", "seconds a collective may take before this rank gives up on its peers "
                "(default: $REMAT_COMM_TIMEOUT, else 300)", std::nullopt, {.min = 0, .min_open = true}),
          threads_flag_spec()};
}

// What train does besides training: the flags' values the Trainer does not take.
struct TrainCli {
  TrainOptions options;
  std::string hf_dir;   // --model: the Hugging Face folder fine-tuned (empty: --config)
  DType hf_dtype = DType::f32;  // --hf-dtype
  std::string save_hf;  // --save-hf OUT (empty: none; a LoRA model's adapters merged)
  std::string save_adapter;  // --save-adapter OUT (empty: none)
  DType adapter_dtype = DType::f32;  // --adapter-dtype
  std::int64_t max_shard_bytes = 0;
  std::string log;      // --log FILE.jsonl (empty: none)
};

// --model or --config -> the config (and the weights to start from).
void set_model(const Flags& f, TrainCli& cli) {
  TrainOptions& o = cli.options;
  cli.hf_dir = f.get("model");
  REMAT_CHECK(cli.hf_dir.empty() || !f.has("config"), Error, "train: --model DIR brings its own config; drop --config");
  if (cli.hf_dir.empty()) {
    o.config = ModelConfig::load(f.get("config"));
  } else {
    o.config = load_hf_config(cli.hf_dir).config;
    o.init_model = cli.hf_dir;
  }
  apply_fine_tune_flags(f, o.config);
  o.adapter = apply_adapter_flag(f, o.config);
  cli.hf_dtype = hf_dtype_from_name(f.has("hf-dtype") ? f.get("hf-dtype")
                                    : cli.hf_dir.empty() ? "f32" : hf_weights_dtype(cli.hf_dir));
}

// --data shards set the vocabulary and are checked against --tokenizer; a
// Hugging Face folder's tokenizer is recorded in saves (for generate) and
// checked against the shards, unless --tokenizer names another.
void set_data_and_tokenizer(const Flags& f, TrainCli& cli) {
  TrainOptions& o = cli.options;
  const std::string& hf_dir = cli.hf_dir;
  o.data_file = f.get("data");
  o.tokenizer = f.get("tokenizer");
  const bool shards = !o.data_file.empty() && is_shard_data(o.data_file);
  if (shards) {
    const auto data = MappedShards::open(o.data_file);
    if (!hf_dir.empty()) {
      REMAT_CHECK(data->vocab() <= o.config.vocab, Error, "--data ", o.data_file, ": the shards' vocabulary of ",
                  data->vocab(), " exceeds the model's (", o.config.vocab, ", ", hf_dir, "/config.json)");
    } else if (o.config.vocab != data->vocab()) {
      std::printf("  note: vocabulary %lld of config %s set to the shards' %lld\n",
                  static_cast<long long>(o.config.vocab), o.config.name.c_str(), static_cast<long long>(data->vocab()));
      o.config.vocab = data->vocab();
    }
    if (!o.tokenizer.empty()) {
      const auto tok = load_tokenizer(o.tokenizer);
      REMAT_CHECK(tok->hash() == data->tokenizer_hash(), Error, "--tokenizer ", o.tokenizer, " (hash ", tok->hash(),
                  ") is not the tokenizer --data ", o.data_file, " was made with (hash ", data->tokenizer_hash(), ")");
    }
  } else {
    REMAT_CHECK(o.tokenizer.empty(), Error, "--tokenizer goes with --data SHARDS (token shards made by ./remat "
                "tokenize); byte-level data needs none");
  }
  if (hf_dir.empty() || !o.tokenizer.empty() || !has_tokenizer_files(hf_dir)) return;
  o.tokenizer = hf_dir;
  if (!shards) return;
  const auto tok = load_tokenizer(hf_dir);
  const auto data = MappedShards::open(o.data_file);
  REMAT_CHECK(tok->hash() == data->tokenizer_hash(), Error, "--data ", o.data_file,
              " was not made with the tokenizer of --model ", hf_dir, " (hashes ", data->tokenizer_hash(), " and ",
              tok->hash(), "); give --tokenizer to name the one it was made with");
}

// --seq-range MIN:MAX: config.seq becomes MAX; --seq, if given, must be MAX.
void set_seq_range(const Flags& f, TrainOptions& o) {
  if (!f.has("seq-range")) return;
  const SeqRange r = parse_seq_range(f.get("seq-range"));
  REMAT_CHECK(!f.has("seq") || f.get_int("seq") == r.max, Error, "--seq ", f.has("seq") ? f.get_int("seq") : 0,
              " and --seq-range ", f.get("seq-range"), " disagree: the model is built for the longest sequence, MAX (",
              r.max, "); drop --seq or make it ", r.max);
  o.config.seq = r.max;
  o.seq_range = r;
}

// The schedule, run length, saving, precision and parallel layout flags;
// names become enums here (an Error naming a bad one).
void set_schedule_and_layout(const Flags& f, TrainOptions& o) {
  o.steps = f.get_int("steps");
  o.stop_after = f.get_int("stop-after");
  o.seed = std::uint64_t(f.get_int("seed"));
  o.lr = f.get_double("lr");
  o.min_lr = f.has("min-lr") ? f.get_double("min-lr") : o.lr / 10;
  o.schedule = parse_lr_schedule(f.get("schedule"));
  o.weight_decay = f.get_double("weight-decay");
  o.clip = f.get_double("clip");
  o.grad_accum = f.get_int("grad-accum");
  o.eval_batches = f.get_int("eval-batches");
  if (f.has("batch")) o.config.batch = f.get_int("batch");
  if (f.has("seq")) o.config.seq = f.get_int("seq");
  set_seq_range(f, o);
  o.warmup = f.get_int("warmup");
  o.recompute = f.get("recompute");
  if (f.has("offload-dir")) o.offload_dir = f.get("offload-dir");
  o.save_dir = f.get("save");
  o.save_every = f.get_int("save-every");
  o.resume_dir = f.get("resume");
  o.eval_every = f.get_int("eval-every");
  o.dtype = compute_dtype_from_name(f.get("dtype"));
  o.on_nonfinite = parse_nonfinite_action(f.get("on-nonfinite"));
  o.max_nonfinite_skips = f.get_int("max-nonfinite-skips");
  o.device = device_flag(f);
  o.dp = f.get_int("dp");
  o.ep = f.get_int("ep");
  o.zero = f.get_int("zero");
  o.pp = f.get_int("pp");
  o.tp = f.get_int("tp");
  o.sp = f.get_bool("sp");
  o.pp_schedule = parse_pipeline_schedule(f.get("pp-schedule"));
  o.pp_split = f.get("pp-split");
  o.bucket_bytes = std::int64_t(f.get_double("bucket-mb") * double(1 << 20));
  o.reuse_routing_metadata = f.get_int("reuse-routing") != 0;
}

// --recompute auto (and --tune-microbatch) chosen here, before the Trainer.
void resolve_plan(const Flags& f, TrainOptions& o) {
  const std::string dtype = dtype_name(o.dtype);
  if (f.get_bool("tune-microbatch")) {
    REMAT_CHECK(o.recompute == "auto", Error, "--tune-microbatch needs --recompute auto (got --recompute ",
                o.recompute, ")");
    REMAT_CHECK(!f.has("grad-accum"), Error, "--tune-microbatch chooses --grad-accum itself; drop one of them");
    o.recompute = resolve_recompute_and_microbatch(f, o.config, dtype, o.device, o.seed, &o.grad_accum);
  } else {
    o.recompute = resolve_recompute(f, o.recompute, o.config, dtype, o.device, o.seed, {o.ep, o.zero, o.pp, o.tp, o.sp});
  }
}

// The flags, once: TrainOptions and what the command does besides training.
TrainCli options_from_flags(const Flags& f) {
  TrainCli cli;
  set_model(f, cli);
  set_data_and_tokenizer(f, cli);
  set_schedule_and_layout(f, cli.options);
  if (f.has("comm-timeout")) set_comm_timeout(f.get_double("comm-timeout"));
  resolve_plan(f, cli.options);
  cli.save_hf = f.get("save-hf");
  cli.save_adapter = f.get("save-adapter");
  cli.adapter_dtype = hf_dtype_from_name(f.get("adapter-dtype"));
  REMAT_CHECK(cli.save_adapter.empty() || (cli.options.config.lora.enabled() && !cli.hf_dir.empty()), Error,
              "--save-adapter writes LoRA adapters for a Hugging Face base: it needs --model DIR and --lora SPEC "
              "(or --adapter DIR)", cli.options.config.lora.enabled() ? "" : "; this run has no adapters");
  cli.max_shard_bytes = std::int64_t(f.get_double("max-shard-mb") * 1e6);
  cli.log = f.get("log");
  return cli;
}

// --save-hf: every rank gathers its experts (a collective), rank 0 writes.
// Under --zero (with or without --pp) no process holds the model: rank 0
// streams the sharded state the ranks wrote in parallel (--save's, or one
// written for this under OUT/.remat-state and removed after) a tensor at a
// time, as `export` does.
void export_hf(const Trainer& trainer, const TrainCli& cli) {
  if (cli.save_hf.empty()) return;
  HfExportOptions eo;
  eo.dtype = cli.hf_dtype;
  eo.max_shard_bytes = cli.max_shard_bytes;
  eo.tokenizer = cli.options.tokenizer;
  const ModelConfig& c = cli.options.config;
  eo.merge_adapter = c.lora.enabled();
  if (cli.options.zero > 0 && trainer.world_size() > 1) {
    const bool own = cli.options.save_dir.empty();  // (--save's state is the final one: run() saved it last)
    const std::string from = own ? (std::filesystem::path(cli.save_hf) / ".remat-state").string() : cli.options.save_dir;
    if (own) trainer.save(from);
    if (trainer.rank() != 0) return;
    export_trained_state(from, cli.save_hf, eo, nullptr);
    if (own) std::filesystem::remove_all(from);
    std::printf("Hugging Face model written to %s (%s weights, streamed from the ranks' shards)\n",
                cli.save_hf.c_str(), dtype_name(cli.hf_dtype));
    return;
  }
  const auto params = trainer.one_process_parameters();
  if (trainer.rank() != 0) return;
  // A LoRA model: W + (alpha / r) B A in f32, then the folder's dtype (train/adapter_files.h).
  save_hf_model(cli.save_hf, without_adapters(c), c.lora.enabled() ? merge_lora(hf_sources(params), c.lora)
                                                                     : hf_sources(params), eo);
  std::printf("Hugging Face model written to %s (%s weights%s)\n", cli.save_hf.c_str(), dtype_name(cli.hf_dtype),
              c.lora.enabled() ? ", the LoRA adapters merged" : "");
}

// --save-adapter: every rank gathers its experts (a collective), rank 0
// writes the PEFT folder (train/adapter_files.h).
void export_adapter(const Trainer& trainer, const TrainCli& cli) {
  if (cli.save_adapter.empty()) return;
  const auto params = trainer.one_process_parameters();
  if (trainer.rank() != 0) return;
  save_adapter(cli.save_adapter, cli.options.config.lora, params, cli.hf_dir, cli.adapter_dtype);
  std::printf("adapter written to %s (LoRA %s, %s weights)\n", cli.save_adapter.c_str(),
              cli.options.config.lora.str().c_str(), dtype_name(cli.adapter_dtype));
}

// --lora / --freeze: what trains.
void print_fine_tuning(const Trainer& trainer, const ModelConfig& c) {
  if (!c.lora.enabled() && c.freeze.empty()) return;
  std::int64_t trainable = 0;
  for (const auto& [name, p] : trainer.model().trainable_parameters()) trainable += p.numel();
  std::printf("  fine-tuning: %s%s%s; %lld parameters train (this rank's), the rest frozen\n",
              c.lora.enabled() ? ("LoRA " + c.lora.str()).c_str() : "", c.lora.enabled() && !c.freeze.empty() ? ", " : "",
              c.freeze.empty() ? "" : ("--freeze " + std::to_string(c.freeze.size()) + " pattern(s)").c_str(),
              static_cast<long long>(trainable));
}

// The run's opening lines: the model, the layout, the data and the schedule.
void print_header(Trainer& trainer, const TrainCli& cli) {
  const TrainOptions& o = cli.options;
  const auto& c = o.config;
  if (!cli.hf_dir.empty()) std::printf("remat train: fine-tuning %s (%s)\n", cli.hf_dir.c_str(), c.arch.c_str());
  if (!o.adapter.empty() && o.resume_dir.empty())
    std::printf("  adapter: %s (LoRA %s) loaded over it\n", o.adapter.c_str(), c.lora.str().c_str());
  std::printf("remat train: config %s (%lld parameters, %lld layers, d %lld), %d threads\n", c.name.c_str(),
              static_cast<long long>(trainer.model_parameters()), static_cast<long long>(c.n_layers),
              static_cast<long long>(c.d_model), num_threads());
  print_fine_tuning(trainer, c);
  if (const PipelineStage* pp = trainer.pipeline()) {
    std::string stages;
    for (std::int64_t st = 0; st < pp->stages(); ++st)
      stages += fmt("%s[%lld, %lld)", st ? " " : "", static_cast<long long>(pp->bounds()[std::size_t(st)]),
                    static_cast<long long>(pp->bounds()[std::size_t(st + 1)]));
    std::printf("  pipeline: %lld stages (blocks %s), %s, %lld micro-batches\n", static_cast<long long>(pp->stages()),
                stages.c_str(), pipeline_schedule_name(pp->schedule()), static_cast<long long>(o.grad_accum));
  }
  if (trainer.world_size() > 1)
    std::printf("  %d ranks: data parallel %d (batch %lld per rank), expert parallel %lld%s\n",
                trainer.world_size() * int(o.pp), trainer.world_size(),
                static_cast<long long>(c.batch / trainer.world_size()), static_cast<long long>(o.ep),
                o.pp > 1 ? fmt(", x %lld pipeline stages", static_cast<long long>(o.pp)).c_str() : "");
  std::printf("  data: %s", trainer.corpus().name.c_str());
  if (trainer.corpus().entropy_floor >= 0)
    std::printf(", entropy floor %.3f nats/byte", trainer.corpus().entropy_floor);
  const std::string seq = o.seq_range ? fmt("[%lld, %lld] tokens (a length per batch%s, --seq-range)",
                                            static_cast<long long>(o.seq_range->min), static_cast<long long>(c.seq),
                                            o.seq_range->log ? ", log-uniform" : "")
                                      : std::to_string(c.seq) + " tokens";
  std::printf("\n  %lld steps of %lld x %s%s, lr %.2g (warm-up %lld, %s to %.2g), start loss ~ ln %lld = %.3f\n",
              static_cast<long long>(o.steps), static_cast<long long>(c.batch), seq.c_str(),
              o.grad_accum > 1 ? fmt(" (%lld micro-batches of %lld)", static_cast<long long>(o.grad_accum),
                                     static_cast<long long>(c.batch / o.grad_accum / trainer.world_size())).c_str()
                               : "",
              o.lr, static_cast<long long>(o.warmup), lr_schedule_name(o.schedule), o.min_lr,
              static_cast<long long>(c.vocab), trainer.initial_loss_estimate());
  if (trainer.step() > 0) std::printf("  resumed at step %lld from %s\n", static_cast<long long>(trainer.step()), o.resume_dir.c_str());
  for (const std::string& note : trainer.resume_notes()) std::printf("  note: %s\n", note.c_str());
  std::fflush(stdout);
}

// Rank 0's view of the steps: the --log lines, the progress lines, a line
// per skipped step, and the totals the summary prints.
class StepReporter {
 public:
  StepReporter(const Trainer& trainer, const TrainCli& cli, ProgressOutput& progress)
      : trainer_(trainer), progress_(progress), f16_(cli.options.dtype == DType::f16) {
    keys_.pipeline = trainer.pipeline() != nullptr;
    keys_.comm = trainer.world_size() > 1 || keys_.pipeline || trainer.tensor_parallel();
    keys_.moe = keys_.pipeline && cli.options.config.experts > 0;
    keys_.dynamic = trainer.model().block_stack().dynamic_remat() != nullptr;
    keys_.seq = cli.options.seq_range.has_value();
    if (cli.log.empty()) return;
    log_ = std::make_unique<std::ofstream>(cli.log);
    REMAT_CHECK(log_->good(), IOError, "--log: cannot write ", cli.log);
  }

  void operator()(const StepStats& s) {
    if (log_) {
      *log_ << s.to_json(keys_) << "\n";
      log_->flush();
    }
    skipped = s.skipped_steps;
    overflows = s.overflow_steps;
    if (s.skipped) {  // an f16 overflow is routine (the scale halves); a non-finite value is worth a line
      if (!s.overflow) print_skipped(s);
      return;
    }
    last_loss = s.loss;
    if (!s.pipeline_stages.empty()) last_stages = s.pipeline_stages;
    tok_s_sum += s.tokens_per_s;
    ++steps;
    if (s.val_loss) {
      if (first_val < 0) first_val = *s.val_loss;
      last_val = *s.val_loss;
    }
    const std::string text = progress_.step(s.step, line(s), s.val_loss.has_value());
    if (!text.empty()) {
      std::fputs(text.c_str(), stdout);
      std::fflush(stdout);
    }
  }

  double first_val = -1, last_val = -1, last_loss = 0, tok_s_sum = 0;
  std::vector<PipelineStageStats> last_stages;  // --pp: the last step's figures per stage
  std::int64_t steps = 0, skipped = 0, overflows = 0;

 private:
  void print_skipped(const StepStats& s) const {
    std::fputs(progress_.end_line().c_str(), stdout);
    std::fflush(stdout);
    const double bad = std::isfinite(s.loss) ? s.grad_norm : s.loss;
    std::fprintf(stderr, "remat train: step %lld: %s %s, update skipped (--on-nonfinite skip; %lld so far)\n",
                 static_cast<long long>(s.step), std::isfinite(s.loss) ? "gradient norm" : "loss",
                 nonfinite_name(bad), static_cast<long long>(s.skipped_steps));
  }

  // The step's progress line.
  std::string line(const StepStats& s) const {
    std::string out = fmt("step %5lld/%lld  loss %.4f  lr %.2e  %7.0f tok/s  elapsed %s  eta %s",
                          static_cast<long long>(s.step), static_cast<long long>(s.total_steps), s.loss, s.lr,
                          s.tokens_per_s, hms(s.elapsed_s).c_str(), hms(s.eta_s).c_str());
    if (!s.routing.empty()) {
      double worst = 0;
      for (const auto& r : s.routing) worst = std::max(worst, r.imbalance);
      out += fmt("  aux %.3f  imbalance %.2f", s.aux_loss, worst);
    }
    if (keys_.seq) out += fmt("  seq %lld", static_cast<long long>(s.seq));
    if (f16_) out += fmt("  scale %g", s.loss_scale);
    if (s.val_loss) {
      out += fmt("  val %.4f", *s.val_loss);
      if (trainer_.corpus().shards) out += fmt(" (ppl %.2f)", std::exp(*s.val_loss));  // tokens: perplexity per token
    }
    return out;
  }

  const Trainer& trainer_;
  ProgressOutput& progress_;
  bool f16_;
  StepLogKeys keys_;
  std::unique_ptr<std::ofstream> log_;  // --log
};

// The closing lines: losses, throughput, the pipeline's stages, skipped updates, the save.
void print_summary(const Trainer& trainer, const TrainCli& cli, const StepReporter& r) {
  if (r.steps == 0) {  // (resumed at the last step)
    std::printf("done: step %lld of %lld reached before this run; no step run\n", static_cast<long long>(trainer.step()),
                static_cast<long long>(cli.options.steps));
    if (!cli.options.save_dir.empty()) std::printf("state saved in %s/state.safetensors\n", cli.options.save_dir.c_str());
    return;
  }
  std::printf("done: %lld steps, final train loss %.4f, validation loss %.4f",
              static_cast<long long>(trainer.step()), r.last_loss, r.last_val);
  if (trainer.corpus().entropy_floor >= 0)
    std::printf(" (entropy floor %.4f, start ~ %.4f)", trainer.corpus().entropy_floor, trainer.initial_loss_estimate());
  std::printf(", %.0f tokens/s on average\n", r.steps ? r.tok_s_sum / double(r.steps) : 0.0);
  if (!r.last_stages.empty()) {
    const double P = double(r.last_stages.size()), M = double(cli.options.grad_accum);
    std::printf("pipeline (last step; an even split's bubble would be (P - 1) / (M + P - 1) = %.1f%%):\n",
                100 * (P - 1) / (M + P - 1));
    for (const PipelineStageStats& p : r.last_stages)
      std::printf("  stage %lld blocks [%lld, %lld): peak %.1f MiB, activations %.1f MiB, %lld micro-batches in flight, "
                  "forward %.1f ms, backward %.1f ms, idle %.1f ms (bubble %.1f%%), sent %.1f MiB\n",
                  static_cast<long long>(p.stage), static_cast<long long>(p.first_block),
                  static_cast<long long>(p.end_block), double(p.peak_allocated_bytes) / (1 << 20),
                  double(p.activation_bytes) / (1 << 20), static_cast<long long>(p.in_flight), p.forward_ms,
                  p.backward_ms, p.idle_ms, 100 * p.bubble(), double(p.sent_bytes) / (1 << 20));
  }
  if (r.skipped > 0 || r.overflows > 0)
    std::printf("skipped updates: %lld non-finite, %lld f16 overflows (loss scale now %g)\n",
                static_cast<long long>(r.skipped), static_cast<long long>(r.overflows), trainer.loss_scale());
  if (!cli.options.save_dir.empty()) std::printf("state saved in %s/state.safetensors\n", cli.options.save_dir.c_str());
}

// Every flag of the train command.
std::vector<FlagSpec> train_flag_specs() {
  std::vector<FlagSpec> specs = model_and_schedule_flags();
  for (FlagSpec& spec : fine_tune_flag_specs()) specs.push_back(std::move(spec));
  for (FlagSpec& spec : run_flags()) specs.push_back(std::move(spec));
  return with_auto_plan_flags(std::move(specs));
}
}  // namespace

TrainOptions train_options_from_args(const std::vector<std::string>& args) {
  Flags f("train", "the options of a training run", args, train_flag_specs());
  // What only the command does with the Trainer's results (writing files
  // after run(), printing): a program does it itself, so these are refused
  // rather than silently ignored.
  for (const char* flag : {"save-hf", "save-adapter", "log", "progress"})
    REMAT_CHECK(!f.has(flag), Error, "--", flag, " is the train command's own (it acts after training); a program "
                "driving the Trainer does that itself (docs/PYTHON.md)");
  apply_threads_flag(f);
  return options_from_flags(f).options;
}

int run_train(const std::vector<std::string>& args) {
  Flags f("train", "train a model, showing progress", args, train_flag_specs());
  apply_threads_flag(f);
  ProgressOutput progress(resolve_progress(f.get("progress"), ::isatty(STDOUT_FILENO) != 0, process_env()));
  const TrainCli cli = options_from_flags(f);
  install_save_fault_from_env();
  Trainer trainer(cli.options);
  // Only rank 0 prints and logs (every rank computes the same global figures).
  std::optional<StepReporter> reporter;
  if (trainer.rank() == 0) reporter.emplace(trainer, cli, progress);
  if (!cli.save_hf.empty()) config_to_hf(cli.options.config, "float32");  // refuses a model HF cannot express before training
  if (!reporter) {
    trainer.run(nullptr);
    export_hf(trainer, cli);
    export_adapter(trainer, cli);
    return 0;
  }
  print_header(trainer, cli);
  try {
    trainer.run(std::ref(*reporter));
  } catch (...) {  // the error (printed by main, on stderr) starts on a fresh line
    std::fputs(progress.end_line().c_str(), stdout);
    std::fflush(stdout);
    throw;
  }
  std::fputs(progress.end_line().c_str(), stdout);
  print_summary(trainer, cli, *reporter);
  export_hf(trainer, cli);
  export_adapter(trainer, cli);
  return 0;
}

}  // namespace remat::tools
