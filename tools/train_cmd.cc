#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <cstdio>
#include <fstream>

#include "engine/parallel_for.h"
#include "tools/args.h"
#include "tokenizer/tokenizer.h"
#include "tools/auto_plan_flags.h"
#include "tools/html.h"
#include "tools/commands.h"
#include "tools/json.h"
#include "tools/progress.h"
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
}  // namespace

int run_train(const std::vector<std::string>& args) {
  Flags f("train", "train a model, showing progress", args,
          with_auto_plan_flags({text_flag("config", "model config: tiny, tiny-moe, bench-dense, bench-moe or FILE.json", "tiny"),
           text_flag("model", "fine-tune a Hugging Face model folder (config.json and safetensors weights; Llama, Qwen2, "
                     "Qwen2-MoE, Mixtral) instead of --config: its architecture and weights, a fresh optimizer"),
           text_flag("save-hf", "at the end, also write the model as a Hugging Face folder OUT (config.json, "
                     "safetensors, the tokenizer's files)"),
           text_flag("hf-dtype", "weights dtype for --save-hf: f32, bf16 or f16 (default: the --model folder's, else f32)"),
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
           int_flag("grad-accum", "micro-batches per step (gradients summed; the batch divides by ranks x N)", 1,
                    {.min = 1}),
           int_flag("eval-batches", "held-out batches per evaluation", 8, {.min = 1}),
           text_flag("recompute", "recompute plan: none, per_block, chunk, selected:I,J, uniform:N, block:N, attention, "
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
           int_flag("pp", "pipeline parallel: split the blocks into N stages, one per rank (run under `mpirun -np N`, "
                    "or N x D ranks for D data-parallel replicas of each stage); micro-batches from --grad-accum", 1,
                    {.min = 1}),
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
           threads_flag_spec()}));
  apply_threads_flag(f);
  ProgressOutput progress(resolve_progress(f.get("progress"), ::isatty(STDOUT_FILENO) != 0, process_env()));
  TrainOptions o;
  const std::string hf_dir = f.get("model");
  REMAT_CHECK(hf_dir.empty() || !f.has("config"), Error, "train: --model DIR brings its own config; drop --config");
  if (hf_dir.empty()) {
    o.config = ModelConfig::load(f.get("config"));
  } else {
    const HfConfig h = load_hf_config(hf_dir);
    o.config = h.config;
    o.init_model = hf_dir;
  }
  const DType hf_dtype = hf_dtype_from_name(f.has("hf-dtype") ? f.get("hf-dtype")
                                            : hf_dir.empty() ? "f32" : hf_weights_dtype(hf_dir));
  o.data_file = f.get("data");
  o.steps = f.get_int("steps");
  o.stop_after = f.get_int("stop-after");
  o.seed = std::uint64_t(f.get_int("seed"));
  o.lr = f.get_double("lr");
  o.min_lr = f.has("min-lr") ? f.get_double("min-lr") : o.lr / 10;
  o.schedule = f.get("schedule");
  o.weight_decay = f.get_double("weight-decay");
  o.clip = f.get_double("clip");
  o.grad_accum = f.get_int("grad-accum");
  o.eval_batches = f.get_int("eval-batches");
  o.tokenizer = f.get("tokenizer");
  if (!o.data_file.empty() && is_shard_data(o.data_file)) {
    const auto shards = MappedShards::open(o.data_file);
    if (!hf_dir.empty()) {
      REMAT_CHECK(shards->vocab() <= o.config.vocab, Error, "--data ", o.data_file, ": the shards' vocabulary of ",
                  shards->vocab(), " exceeds the model's (", o.config.vocab, ", ", hf_dir, "/config.json)");
    } else if (o.config.vocab != shards->vocab()) {
      std::printf("  note: vocabulary %lld of config %s set to the shards' %lld\n",
                  static_cast<long long>(o.config.vocab), o.config.name.c_str(),
                  static_cast<long long>(shards->vocab()));
      o.config.vocab = shards->vocab();
    }
    if (!o.tokenizer.empty()) {
      const auto tok = load_tokenizer(o.tokenizer);
      REMAT_CHECK(tok->hash() == shards->tokenizer_hash(), Error, "--tokenizer ", o.tokenizer, " (hash ", tok->hash(),
                  ") is not the tokenizer --data ", o.data_file, " was made with (hash ", shards->tokenizer_hash(), ")");
    }
  } else {
    REMAT_CHECK(o.tokenizer.empty(), Error, "--tokenizer goes with --data SHARDS (token shards made by ./remat "
                "tokenize); byte-level data needs none");
  }
  // A Hugging Face folder's tokenizer is recorded in saves (for generate)
  // and checked against the shards, unless --tokenizer names another.
  if (!hf_dir.empty() && o.tokenizer.empty() && has_tokenizer_files(hf_dir)) {
    o.tokenizer = hf_dir;
    if (!o.data_file.empty() && is_shard_data(o.data_file)) {
      const auto tok = load_tokenizer(hf_dir);
      const auto shards = MappedShards::open(o.data_file);
      REMAT_CHECK(tok->hash() == shards->tokenizer_hash(), Error, "--data ", o.data_file,
                  " was not made with the tokenizer of --model ", hf_dir, " (hashes ", shards->tokenizer_hash(),
                  " and ", tok->hash(), "); give --tokenizer to name the one it was made with");
    }
  }
  if (f.has("batch")) o.config.batch = f.get_int("batch");
  if (f.has("seq")) o.config.seq = f.get_int("seq");
  o.warmup = f.get_int("warmup");
  o.recompute = f.get("recompute");
  if (f.has("offload-dir")) o.offload_dir = f.get("offload-dir");
  o.save_dir = f.get("save");
  o.save_every = f.get_int("save-every");
  o.resume_dir = f.get("resume");
  o.eval_every = f.get_int("eval-every");
  o.dtype = f.get("dtype");
  o.on_nonfinite = f.get("on-nonfinite");  // checked by the Trainer
  o.max_nonfinite_skips = f.get_int("max-nonfinite-skips");
  o.device = device_flag(f);
  o.dp = f.get_int("dp");
  o.ep = f.get_int("ep");
  o.pp = f.get_int("pp");
  o.pp_schedule = f.get("pp-schedule");
  o.pp_split = f.get("pp-split");
  o.bucket_bytes = std::int64_t(f.get_double("bucket-mb") * double(1 << 20));
  o.reuse_routing_metadata = f.get_int("reuse-routing") != 0;
  if (f.has("comm-timeout")) set_comm_timeout(f.get_double("comm-timeout"));
  if (f.get_bool("tune-microbatch")) {
    REMAT_CHECK(o.recompute == "auto", Error, "--tune-microbatch needs --recompute auto (got --recompute ",
                o.recompute, ")");
    REMAT_CHECK(!f.has("grad-accum"), Error, "--tune-microbatch chooses --grad-accum itself; drop one of them");
    o.recompute = resolve_recompute_and_microbatch(f, o.config, o.dtype, o.device, o.seed, &o.grad_accum);
  } else {
    o.recompute = resolve_recompute(f, o.recompute, o.config, o.dtype, o.device, o.seed);
  }

  install_save_fault_from_env();
  Trainer trainer(o);
  // Only rank 0 prints and logs (every rank computes the same global figures).
  const bool lead = trainer.rank() == 0;
  std::unique_ptr<std::ofstream> log;
  if (f.has("log") && lead) {
    log = std::make_unique<std::ofstream>(f.get("log"));
    REMAT_CHECK(log->good(), IOError, "--log: cannot write ", f.get("log"));
  }

  // --save-hf: every rank gathers its experts (a collective), rank 0 writes.
  const std::string save_hf = f.get("save-hf");
  auto export_hf = [&] {
    if (save_hf.empty()) return;
    const auto params = trainer.one_process_parameters();
    if (!lead) return;
    HfExportOptions eo;
    eo.dtype = hf_dtype;
    eo.max_shard_bytes = std::int64_t(f.get_double("max-shard-mb") * 1e6);
    eo.tokenizer = o.tokenizer;
    save_hf_model(save_hf, o.config, params, eo);
    std::printf("Hugging Face model written to %s (%s weights)\n", save_hf.c_str(), dtype_name(hf_dtype));
  };
  if (!save_hf.empty()) config_to_hf(o.config, "float32");  // refuses a model HF cannot express before training

  const auto& c = o.config;
  if (!lead) {
    trainer.run(nullptr);
    export_hf();
    return 0;
  }
  if (!hf_dir.empty()) std::printf("remat train: fine-tuning %s (%s)\n", hf_dir.c_str(), o.config.arch.c_str());
  std::printf("remat train: config %s (%lld parameters, %lld layers, d %lld), %d threads\n", c.name.c_str(),
              static_cast<long long>(trainer.model().num_parameters()), static_cast<long long>(c.n_layers),
              static_cast<long long>(c.d_model), num_threads());
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
  std::printf("\n  %lld steps of %lld x %lld tokens%s, lr %.2g (warm-up %lld, %s to %.2g), start loss ~ ln %lld = %.3f\n",
              static_cast<long long>(o.steps), static_cast<long long>(c.batch), static_cast<long long>(c.seq),
              o.grad_accum > 1 ? fmt(" (%lld micro-batches of %lld)", static_cast<long long>(o.grad_accum),
                                     static_cast<long long>(c.batch / o.grad_accum / trainer.world_size())).c_str()
                               : "",
              o.lr, static_cast<long long>(o.warmup), o.schedule.c_str(), o.min_lr, static_cast<long long>(c.vocab),
              trainer.initial_loss_estimate());
  if (trainer.step() > 0) std::printf("  resumed at step %lld from %s\n", static_cast<long long>(trainer.step()), o.resume_dir.c_str());
  for (const std::string& note : trainer.resume_notes()) std::printf("  note: %s\n", note.c_str());
  std::fflush(stdout);

  double first_val = -1, last_val = -1, last_loss = 0, tok_s_sum = 0;
  std::vector<PipelineStageStats> last_stages;  // --pp: the last step's figures per stage
  std::int64_t n = 0, skipped = 0, overflows = 0;
  const bool f16 = o.dtype == "f16";
  const auto on_step = [&](const StepStats& s) {
    if (log) {
      JsonObject j;
      j.set("step", s.step).set("loss", s.loss).set("lr", s.lr).set("grad_norm", s.grad_norm);
      j.set("tokens_per_s", s.tokens_per_s).set("step_ms", s.step_ms);
      j.set("peak_allocated_bytes", s.peak_allocated_bytes).set("peak_reserved_bytes", s.peak_reserved_bytes);
      j.set("persistent_bytes", s.persistent_bytes).set("activation_bytes", s.activation_bytes);
      j.set("recomputed_ops", s.recomputed_ops).set("saved_bytes_peak", s.saved_bytes_peak);
      j.set("offloaded_bytes", s.offloaded_bytes).set("offload_ms", s.offload_wait_ms);
      j.set("compressed_saved_bytes", s.compressed_saved_bytes);
      j.set("boundary_bytes", s.boundary_bytes);
      if (trainer.pipeline()) {
        j.set("pipeline_in_flight", s.pipeline_in_flight);
        std::string stages = "[";
        for (const PipelineStageStats& p : s.pipeline_stages) {
          JsonObject o;
          o.set("stage", p.stage).set("first_block", p.first_block).set("end_block", p.end_block);
          o.set("peak_allocated_bytes", p.peak_allocated_bytes).set("activation_bytes", p.activation_bytes);
          o.set("in_flight", p.in_flight).set("forward_ms", p.forward_ms).set("backward_ms", p.backward_ms);
          o.set("idle_ms", p.idle_ms).set("bubble", p.bubble()).set("sent_bytes", p.sent_bytes);
          stages += (stages.size() > 1 ? ", " : "") + o.str();
        }
        j.set_raw("pipeline_stages", stages + "]");
      }
      j.set("skipped", s.skipped).set("skipped_steps", s.skipped_steps);
      j.set("loss_scale", s.loss_scale).set("overflow_steps", s.overflow_steps);
      if (trainer.world_size() > 1 || trainer.pipeline()) {
        JsonObject comm;
        for (CommPhase p : {CommPhase::forward, CommPhase::backward, CommPhase::replay}) {
          JsonObject ph;
          ph.set("calls", s.comm.calls_in(p)).set("bytes", s.comm.bytes_in(p));
          for (std::size_t k = 0; k < kCollectiveKinds; ++k) {
            const auto kind = CollectiveKind(k);
            if (s.comm.calls_of(kind, p) == 0) continue;
            JsonObject one;
            one.set("calls", s.comm.calls_of(kind, p)).set("bytes", s.comm.bytes_of(kind, p));
            ph.set_raw(collective_name(kind), one.str());
          }
          comm.set_raw(phase_name(p), ph.str());
        }
        j.set_raw("comm", comm.str());
        j.set("grad_buckets", s.grad_buckets).set("grad_buckets_overlapped", s.grad_buckets_overlapped);
        j.set("routing_metadata_saved_bytes", s.routing_metadata_saved_bytes);
      }
      if (s.val_loss) j.set("val_loss", *s.val_loss);
      if (!s.routing.empty()) {
        std::string layers = "[";
        double worst = 0;
        std::int64_t dropped = 0;
        for (std::size_t i = 0; i < s.routing.size(); ++i) {
          const auto& r = s.routing[i];
          std::string tpe = "[";
          for (std::size_t e = 0; e < r.tokens_per_expert.size(); ++e)
            tpe += (e ? "," : "") + std::to_string(r.tokens_per_expert[e]);
          JsonObject l;
          l.set("layer", r.layer).set_raw("tokens_per_expert", tpe + "]").set("imbalance", r.imbalance);
          l.set("dropped", r.dropped).set("aux", r.aux).set("z_loss", r.z);
          layers += (i ? ", " : "") + l.str();
          worst = std::max(worst, r.imbalance);
          dropped += r.dropped;
        }
        j.set("loss_aux", s.aux_loss).set("moe_imbalance_max", worst).set("moe_dropped", dropped);
        j.set("moved_bytes", s.moved_bytes).set("replayed_comm_bytes", s.replayed_comm_bytes);
        j.set_raw("moe", layers + "]");
      } else if (trainer.pipeline() && o.config.experts > 0) {
        j.set("loss_aux", s.aux_loss);  // (per-layer routing metrics stay on their stages)
      }
      *log << j.str() << "\n";
      log->flush();
    }
    skipped = s.skipped_steps;
    overflows = s.overflow_steps;
    if (s.skipped) {  // an f16 overflow is routine (the scale halves); a non-finite value is worth a line
      if (!s.overflow) {
        std::fputs(progress.end_line().c_str(), stdout);
        std::fflush(stdout);
        const double bad = std::isfinite(s.loss) ? s.grad_norm : s.loss;
        std::fprintf(stderr, "remat train: step %lld: %s %s, update skipped (--on-nonfinite skip; %lld so far)\n",
                     static_cast<long long>(s.step), std::isfinite(s.loss) ? "gradient norm" : "loss",
                     std::isnan(bad) ? "nan" : bad > 0 ? "inf" : "-inf", static_cast<long long>(s.skipped_steps));
      }
      return;
    }
    last_loss = s.loss;
    if (!s.pipeline_stages.empty()) last_stages = s.pipeline_stages;
    tok_s_sum += s.tokens_per_s;
    ++n;
    char line[320];
    std::snprintf(line, sizeof line, "step %5lld/%lld  loss %.4f  lr %.2e  %7.0f tok/s  elapsed %s  eta %s",
                  static_cast<long long>(s.step), static_cast<long long>(s.total_steps), s.loss, s.lr,
                  s.tokens_per_s, hms(s.elapsed_s).c_str(), hms(s.eta_s).c_str());
    if (!s.routing.empty()) {
      double worst = 0;
      for (const auto& r : s.routing) worst = std::max(worst, r.imbalance);
      const std::size_t len = std::strlen(line);
      std::snprintf(line + len, sizeof line - len, "  aux %.3f  imbalance %.2f", s.aux_loss, worst);
    }
    if (f16) {
      const std::size_t len = std::strlen(line);
      std::snprintf(line + len, sizeof line - len, "  scale %g", s.loss_scale);
    }
    if (s.val_loss) {
      if (first_val < 0) first_val = *s.val_loss;
      last_val = *s.val_loss;
      const std::size_t len = std::strlen(line);
      std::snprintf(line + len, sizeof line - len, "  val %.4f", *s.val_loss);
      if (trainer.corpus().shards) {  // tokens: perplexity per token
        const std::size_t l2 = std::strlen(line);
        std::snprintf(line + l2, sizeof line - l2, " (ppl %.2f)", std::exp(*s.val_loss));
      }
    }
    const std::string text = progress.step(s.step, line, s.val_loss.has_value());
    if (!text.empty()) {
      std::fputs(text.c_str(), stdout);
      std::fflush(stdout);
    }
  };
  try {
    trainer.run(on_step);
  } catch (...) {  // the error (printed by main, on stderr) starts on a fresh line
    std::fputs(progress.end_line().c_str(), stdout);
    std::fflush(stdout);
    throw;
  }
  std::fputs(progress.end_line().c_str(), stdout);
  std::printf("done: %lld steps, final train loss %.4f, validation loss %.4f",
              static_cast<long long>(trainer.step()), last_loss, last_val);
  if (trainer.corpus().entropy_floor >= 0)
    std::printf(" (entropy floor %.4f, start ~ %.4f)", trainer.corpus().entropy_floor, trainer.initial_loss_estimate());
  std::printf(", %.0f tokens/s on average\n", n ? tok_s_sum / double(n) : 0.0);
  if (!last_stages.empty()) {
    const double P = double(last_stages.size()), M = double(o.grad_accum);
    std::printf("pipeline (last step; an even split's bubble would be (P - 1) / (M + P - 1) = %.1f%%):\n",
                100 * (P - 1) / (M + P - 1));
    for (const PipelineStageStats& p : last_stages)
      std::printf("  stage %lld blocks [%lld, %lld): peak %.1f MiB, activations %.1f MiB, %lld micro-batches in flight, "
                  "forward %.1f ms, backward %.1f ms, idle %.1f ms (bubble %.1f%%), sent %.1f MiB\n",
                  static_cast<long long>(p.stage), static_cast<long long>(p.first_block),
                  static_cast<long long>(p.end_block), double(p.peak_allocated_bytes) / (1 << 20),
                  double(p.activation_bytes) / (1 << 20), static_cast<long long>(p.in_flight), p.forward_ms,
                  p.backward_ms, p.idle_ms, 100 * p.bubble(), double(p.sent_bytes) / (1 << 20));
  }
  if (skipped > 0 || overflows > 0)
    std::printf("skipped updates: %lld non-finite, %lld f16 overflows (loss scale now %g)\n",
                static_cast<long long>(skipped), static_cast<long long>(overflows), trainer.loss_scale());
  if (!o.save_dir.empty()) std::printf("state saved in %s/state.safetensors\n", o.save_dir.c_str());
  export_hf();
  return 0;
}

}  // namespace remat::tools
