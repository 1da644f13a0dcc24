// Trainer's saved state: save, resume, the one-process layout of the
// parameters, and load_trained_model (train/trainer.h).
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <set>
#include <utility>

#include "engine/grad_mode.h"
#include "engine/rng.h"
#include "models/layers.h"
#include "train/adapter_files.h"
#include "train/safetensors.h"
#include "train/sharded_state.h"
#include "train/state_reader.h"
#include "train/state_files.h"
#include "train/trainer.h"

namespace remat {

namespace {
// A double as text that reads back to the same bits.
std::string format_exact(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}
constexpr const char* kFormat = "remat-train-state-1";

// A routed expert's name (or its optimizer state's) -> the position of its
// index and the index; npos when not a routed expert's (models/moe_layer.h).
std::pair<std::size_t, std::int64_t> expert_index(const std::string& name) {
  const RoutedExpertName r = routed_expert_name(name);
  return {r.at, r.expert};
}
// A state tensor's parameter: "optimizer.exp_avg.<name>" -> name.
std::string parameter_of(const std::string& name) {
  for (const char* prefix : {"optimizer.exp_avg.", "optimizer.exp_avg_sq."})
    if (name.rfind(prefix, 0) == 0) return name.substr(std::string(prefix).size());
  return name;
}
}  // namespace

std::vector<std::pair<std::string, Tensor>> Trainer::parameter_values() const {
  return zero_ ? zero_->parameter_values() : owned_parameters();
}

std::vector<std::pair<std::string, Tensor>> Trainer::gather_tensor_parallel(
    std::vector<std::pair<std::string, Tensor>> tensors) const {
  if (!tp_) return tensors;
  for (auto& [name, t] : tensors)
    if (const TpSlice sl = tp_slice(opts_.config, parameter_of(name), tp_->size(), tp_->rank()); sl.split())
      t = tp_whole(*tp_->group, t, sl);
  return tensors;
}

std::vector<std::pair<std::string, Tensor>> Trainer::one_process_parameters() const {
  std::vector<std::pair<std::string, Tensor>> tensors = gather_experts(gather_tensor_parallel(parameter_values()));
  // Replica 0's pipeline gathers its stages to rank 0 (the other replicas hold the same).
  if (pipeline_ && layout_.world->rank() == 0)
    tensors = pipeline_->gather_to_first(std::move(tensors));
  return tensors;
}

std::vector<std::pair<std::string, Tensor>> Trainer::gather_experts(
    std::vector<std::pair<std::string, Tensor>> tensors) const {
  if (layout_.ep > 1) {
    // Gather every expert (and its optimizer state) from the expert-parallel
    // group: rank j holds local expert i as global expert j * per + i.
    const std::int64_t K = layout_.ep, per = opts_.config.experts / K;
    const std::int64_t first = layout_.ep_group->rank() * per;
    std::vector<std::pair<std::string, Tensor>> all;
    for (const auto& [name, t] : tensors) {
      const auto [at, e] = expert_index(name);
      if (at == std::string::npos) {
        all.emplace_back(name, t);
        continue;
      }
      Tensor gathered = layout_.ep_group->all_gather(t.contiguous());
      const std::int64_t rows = t.size(0);
      const std::string tail = name.substr(name.find('.', at));
      for (std::int64_t j = 0; j < K; ++j)
        all.emplace_back(name.substr(0, at) + std::to_string(j * per + (e - first)) + tail,
                         gathered.narrow(0, j * rows, rows).contiguous());
    }
    tensors = std::move(all);
  }
  return tensors;
}

std::vector<std::pair<std::string, Tensor>> Trainer::optimizer_state() const {
  return zero_ ? zero_->one_process_state() : optimizer_->state();
}

void Trainer::save(const std::string& dir) const {
  // --zero: every rank of the job writes its own shards (under --pp, each
  // stage's replicas shard their stage), rank 0 the index and the unsharded
  // tensors (train/sharded_state.h). Otherwise one file in the layout of one
  // process, gathered to rank 0.
  // (under --tp a slice's pieces would share names across the ranks of the
  // slice: the state is gathered into one process's layout instead)
  const bool sharded = zero_ != nullptr && !tp_;
  std::string index;
  std::vector<std::pair<std::string, Tensor>> tensors;
  if (sharded) {
    const std::string folder = shard_folder_name(dir, step_);
    write_rank_shards(dir, folder, job_->rank(), job_->size(), step_, zero_->shard_pieces_named());
    tensors = gather_experts(zero_->unsharded_named());
    if (pipeline_ && layout_.world->rank() == 0)  // replica 0's stages' unsharded tensors to rank 0
      tensors = pipeline_->gather_to_first(std::move(tensors));
    job_->barrier();  // every rank file is written before the index commits the set
    // Every stage's sharded tensors, from the whole model's shapes.
    std::vector<std::pair<std::string, Shape>> shapes;
    for (const auto& [name, p] : model_->named_parameters())
      if (zero_shards_parameter(layout_.ep, name))
        for (const char* prefix : {"", "optimizer.exp_avg.", "optimizer.exp_avg_sq."})
          shapes.emplace_back(prefix + name, p.sizes());
    index = shard_index(folder, job_->size(), step_, shapes);
  } else {
    tensors = parameter_values();
    for (auto& t : optimizer_state()) tensors.push_back(t);
    tensors = gather_experts(gather_tensor_parallel(std::move(tensors)));
    if (pipeline_ && layout_.world->rank() == 0)  // replica 0's stages to rank 0
      tensors = pipeline_->gather_to_first(std::move(tensors));
  }
  if (rank() == 0) {
    const RngState data = sampler_->state();
    const RngState dropout = default_generator(opts_.device).state();
    std::map<std::string, std::string> meta = {
        {"format", kFormat},
        {"step", std::to_string(step_)},
        {"seed", std::to_string(opts_.seed)},
        {"config", opts_.config.to_json().dump()},
        {"data", opts_.data_file.empty() ? "generated" : opts_.data_file},
        {"tokenizer", opts_.tokenizer},
        {"data_rng_seed", std::to_string(data.seed)},
        {"data_rng_offset", std::to_string(data.offset)},
        {"rng_seed", std::to_string(dropout.seed)},
        {"rng_offset", std::to_string(dropout.offset)},
        {"world_size", std::to_string(job_->size())},
        {"ep", std::to_string(layout_.ep)},
        {"zero", std::to_string(opts_.zero)},  // (informative: any layout resumes any state)
        // f16's dynamic loss scale (1 and 0 for f32/bf16), so a resumed run
        // continues with the same scale and growth count.
        {"loss_scale", format_exact(scaler_.scale())},
        {"loss_scale_good_steps", std::to_string(scaler_.good_steps())},
    };
    if (sharded) meta[kShardIndexKey] = index;
    // Every tensor checksummed; written crash-safely (train/state_files.h).
    save_state_files(dir, encode_safetensors(tensors, meta, {}, state_file(dir)));
    if (sharded) remove_unreferenced_shards(dir);  // (the previous state's set stays)
  }
  job_->barrier();  // nobody reads the state before it is complete
}

namespace {
// The part of parameter `name` this rank holds (whole without --tp).
using SliceOf = std::function<TpSlice(const std::string& name)>;
Shape whole_shape(const Tensor& p, const TpSlice& s) {
  Shape shape = p.sizes();
  if (s.split()) shape[std::size_t(s.dim)] *= s.parts;
  return shape;
}
// State tensor `name`'s slice `s` into dst (verified as read_state_tensor).
void read_slice(const StateReader& reader, const std::string& name, const TpSlice& s, Tensor& dst) {
  if (!s.split()) return read_state_tensor(reader, name, dst);
  NoGradGuard ng;
  dst.copy_(tp_take_slice(reader.read(name), s));
}

// A frozen parameter that a state holds in bf16 / f16 (it was loaded from
// such a folder) takes that dtype before the state is checked and read.
void adopt_frozen_dtypes(const StateReader& reader, const DecoderModel& model) {
  for (auto& [name, p] : model.named_parameters()) {
    if (p.requires_grad() || !reader.has(name) || reader.dtype(name) == p.dtype()) continue;
    const DType t = reader.dtype(name);
    if (t != DType::bf16 && t != DType::f16) continue;
    Tensor frozen = p;
    frozen.convert_(t);
  }
}

// On a failure to resume from DIR: what the previous state offers (read
// only then; nothing when it is the state that failed).
std::string previous_state_hint(const std::string& dir, bool failed_is_prev) {
  const std::string prev = prev_state_file(dir);
  if (failed_is_prev) return "";
  struct stat st;
  if (::stat(prev.c_str(), &st) != 0) return " (there is no previous state " + prev + ")";
  try {
    const SafetensorsFile p = load_safetensors(prev);
    const auto step = p.metadata.find("step");
    return " (the previous state " + prev + " is intact: " +
           (step == p.metadata.end() ? "" : "step " + step->second + ", ") +
           (p.checksummed ? "every checksum matches" : "no checksums to verify") + "; move it to " +
           state_file(dir) + " to resume from it)";
  } catch (const IOError& e) {
    return std::string(" (the previous state is damaged too: ") + e.what() + ")";
  }
}

// The state file --resume chose, opened (headers only: every tensor is read
// later, by name or range, each read verified); its metadata read by key,
// each failure an IOError naming the file and what the previous state offers.
struct ResumedState {
  ResumedState(const std::string& folder, const StateChoice& choice)
      : dir(folder), path(choice.path), from_prev(choice.from_prev), reader(open(folder, choice.path, hint())) {}
  static StateReader open(const std::string& folder, const std::string& path, const std::string& hint) {
    try {
      return StateReader(folder, path);  // (a sharded set: every rank file's header, checked against the index)
    } catch (const IOError& e) {
      throw IOError(std::string("--resume: ") + e.what() + hint);
    }
  }
  std::string hint() const { return previous_state_hint(dir, from_prev); }
  const std::string& meta(const char* key) const {
    auto it = reader.metadata().find(key);
    REMAT_CHECK(it != reader.metadata().end(), IOError, "--resume: ", path, " has no metadata '", key, "'", hint());
    return it->second;
  }
  std::uint64_t meta_u64(const char* key) const {
    const std::string& v = meta(key);
    REMAT_CHECK(!v.empty() && v.find_first_not_of("0123456789") == std::string::npos, IOError,
                "--resume: metadata '", key, "' of ", path, " is not a number: '", v, "'", hint());
    return std::stoull(v);
  }
  // Tensor `name` is in the state with `shape` and `dtype` (`what` names it
  // in the error: "parameter" or "optimizer state").
  void check_tensor(const std::string& what, const std::string& name, const Shape& shape, DType dtype) const {
    REMAT_CHECK(reader.has(name), IOError, "--resume: ", path, " is missing ", what, " '", name, "'", hint());
    REMAT_CHECK(reader.shape(name) == shape && reader.dtype(name) == dtype, IOError, "--resume: ", what, " '", name,
                "' in ", path, " is ", shape_str(reader.shape(name)), " ", reader.dtype(name), ", expected ",
                shape_str(shape), " ", dtype);
  }
  // Every parameter of `model` is in the state with its shape and dtype, and
  // the AdamW moments of every parameter this rank updates (`owned`: the
  // ones that train).
  // Under --tp the state holds the whole tensors this rank has slices of.
  void check_tensors(const DecoderModel& model, const std::vector<std::pair<std::string, Tensor>>& owned,
                     const SliceOf& slice_of) const {
    for (const auto& [name, p] : model.named_parameters())
      check_tensor("parameter", name, whole_shape(p, slice_of(name)), p.dtype());
    for (const auto& [name, p] : owned)
      for (const char* prefix : {"optimizer.exp_avg.", "optimizer.exp_avg_sq."})
        check_tensor("optimizer state", prefix + name, whole_shape(p, slice_of(name)), DType::f32);
  }
  // The saved f16 loss scale (finite, > 0) and its good-step count; nullopt
  // for a state written before loss scaling.
  std::optional<std::pair<double, std::int64_t>> loss_scale() const {
    if (!reader.metadata().count("loss_scale")) return std::nullopt;
    const std::string& v = meta("loss_scale");
    char* end = nullptr;
    const double scale = std::strtod(v.c_str(), &end);
    REMAT_CHECK(!v.empty() && end && *end == '\0' && std::isfinite(scale) && scale > 0, IOError,
                "--resume: metadata 'loss_scale' of ", path, " is not a finite number > 0: '", v, "'", hint());
    return std::pair(scale, std::int64_t(meta_u64("loss_scale_good_steps")));
  }

  std::string dir;   // the --resume folder
  std::string path;  // the state file chosen in it
  bool from_prev;    // ... the previous state (the current one was missing or damaged)
  StateReader reader;
};

// Elements [begin, begin + out.numel()) of slice `s` of state tensor `name`
// (flattened) into `out` (contiguous f32 on the CPU): runs within the
// slice's rows of the whole tensor.
void read_slice_range(const StateReader& reader, const std::string& name, const TpSlice& s, std::int64_t begin,
                      Tensor& out) {
  Tensor flat = out.view({-1});
  for_each_slice_run(reader.shape(name), s, begin, out.numel(), [&](std::int64_t at, std::int64_t e, std::int64_t n) {
    Tensor part = flat.narrow(0, e - begin, n);
    reader.read_range(name, at, part);
  });
}

// Elements [begin, begin + out.numel()) of state tensor `name` into `out`
// (contiguous f32, any device): a rank's ranges of a one-process state
// (under --tp, of this rank's slice of it).
ParameterRangeSource state_ranges(const StateReader& reader, const SliceOf& slice_of) {
  return [&reader, slice_of](const std::string& name, std::int64_t begin, Tensor& out) {
    if (const TpSlice s = slice_of(parameter_of(name)); s.split()) return read_slice_range(reader, name, s, begin, out);
    if (out.device().is_cpu()) return reader.read_range(name, begin, out);
    Tensor host = empty(out.sizes(), TensorOptions(DType::f32, kCPU));
    reader.read_range(name, begin, host);
    out.copy_(host);
  };
}

// Checks every byte load_values reads against its checksum: the parameters
// this rank keeps whole, its ZeRO ranges (or AdamW's moments whole).
void verify_values(const StateReader& reader, const DecoderModel& model, const ZeroOptimizer* zero,
                   const AdamW* optimizer, const SliceOf& slice_of) {
  for (const auto& [name, p] : model.named_parameters())
    if (!p.released()) reader.verify_range(name, 0, p.numel() * slice_of(name).parts);
  if (zero) {
    std::set<std::string> sliced;  // (verified whole: a slice's range is not one range of the tensor)
    for (const ZeroOptimizer::StateRange& r : zero->loaded_ranges()) {
      if (!slice_of(parameter_of(r.name)).split())
        reader.verify_range(r.name, r.begin, r.n);
      else if (sliced.insert(r.name).second)
        reader.verify_range(r.name, 0, shape_numel(reader.shape(r.name)));
    }
  } else {
    for (const auto& [name, t] : optimizer->state())
      reader.verify_range(name, 0, t.numel() * slice_of(parameter_of(name)).parts);
  }
}

// The values this rank holds, from the state (names and shapes checked
// before, bytes verified by verify_values): the parameters it keeps whole,
// its ZeRO shards by range, the optimizer's moments (by range under --zero).
// A read that fails now (a short read) leaves them partly loaded.
void load_values(const StateReader& reader, DecoderModel& model, ZeroOptimizer* zero, AdamW* optimizer,
                 std::int64_t step, const SliceOf& slice_of) {
  NoGradGuard ng;
  for (auto& [name, p] : model.named_parameters()) {
    if (p.released()) continue;  // another pipeline stage's, or sharded (--zero 3)
    Tensor dst = p;
    read_slice(reader, name, slice_of(name), dst);
  }
  if (zero) {
    zero->load_parameters(state_ranges(reader, slice_of));  // --zero 3: this rank's shards
    zero->load_state(state_ranges(reader, slice_of), step);
  } else {
    optimizer->fill_state([&](const std::string& prefix, const std::string& name,
                              Tensor& dst) { read_slice(reader, prefix + name, slice_of(name), dst); },
                          step);
  }
}

// Runs `step` on this rank; when it failed on any rank of `job`, every rank
// throws that rank's IOError (a collective).
void run_on_every_rank(ProcessGroup& job, const ResumedState& st, const std::function<void()>& step) {
  std::optional<std::string> failed;
  try {
    step();
  } catch (const std::exception& e) {
    const std::string what = e.what();
    failed = what.rfind("--resume: ", 0) == 0 ? what : "--resume: " + what + st.hint();
  }
  if (const std::optional<RankFailure> f = first_failure(job, failed))
    throw IOError(f->rank == job.rank() ? f->message
                                        : f->message + " (found by rank " + std::to_string(f->rank) + ")");
}
}  // namespace

void Trainer::resume(const std::string& dir) {
  resume_notes_.clear();
  StateChoice choice = choose_state_file(dir);
  const ResumedState st(dir, choice);
  const std::string& cur = st.path;
  if (!st.reader.checksummed())
    choice.notes.push_back(cur + " has no checksums (written before remat recorded them): loaded without an "
                           "integrity check; the next save adds them");
  REMAT_CHECK(st.meta("format") == kFormat, IOError, "--resume: ", cur, " has format '", st.meta("format"),
              "', expected ", kFormat);
  const ModelConfig saved = ModelConfig::from_json(Json::parse(st.meta("config"), cur + " config"));
  REMAT_CHECK(saved.to_json().dump() == opts_.config.to_json().dump(), IOError, "--resume: ", cur,
              " was trained with config ", saved.to_json().dump(), ", but this run uses ",
              opts_.config.to_json().dump());
  const std::int64_t step = std::int64_t(st.meta_u64("step"));
  const SliceOf slice_of = [this](const std::string& name) {
    return tp_ ? tp_slice(opts_.config, name, tp_->size(), tp_->rank()) : TpSlice{};
  };
  adopt_frozen_dtypes(st.reader, *model_);
  st.check_tensors(*model_, trainable_parameters(), slice_of);  // every name and shape before changing anything
  const RngState data{st.meta_u64("data_rng_seed"), st.meta_u64("data_rng_offset")};
  const RngState rng{st.meta_u64("rng_seed"), st.meta_u64("rng_offset")};
  std::pair<double, std::int64_t> scale{1.0, 0};
  if (const auto saved_scale = st.loss_scale()) {
    scale = *saved_scale;
  } else if (scaler_.enabled()) {
    choice.notes.push_back(cur + " has no loss scale (written before f16 loss scaling): starting from " +
                           format_exact(opts_.loss_scale_init));
    scale.first = opts_.loss_scale_init;
  }
  // Each rank reads only what it holds, so a damaged piece may be seen by
  // one rank alone: every rank learns of it and stops with its message,
  // before any value changes (every byte is verified first).
  run_on_every_rank(*job_, st, [&] { verify_values(st.reader, *model_, zero_.get(), optimizer_.get(), slice_of); });
  run_on_every_rank(*job_, st, [&] { load_values(st.reader, *model_, zero_.get(), optimizer_.get(), step, slice_of); });
  sampler_->set_state(data);
  default_generator(opts_.device).set_state(rng);
  if (scaler_.enabled()) set_loss_scale(scale.first, scale.second);
  step_ = step;
  resume_notes_ = std::move(choice.notes);
}

namespace {
// The model config a training state was saved with (IOError for a file that
// is not a remat state or has no config).
ModelConfig state_config(const StateReader& f) {
  const auto& meta = f.metadata();
  auto it = meta.find("format");
  REMAT_CHECK(it != meta.end() && it->second == kFormat, IOError, f.path(),
              " is not a remat training state (metadata format '", it == meta.end() ? "" : it->second,
              "', expected ", kFormat, ")");
  auto cfg = meta.find("config");
  REMAT_CHECK(cfg != meta.end(), IOError, f.path(), " has no metadata 'config'");
  return ModelConfig::from_json(Json::parse(cfg->second, f.path() + " config"));
}

// A training state's parameters, each read when asked (export_trained_state
// and export_trained_adapter read one at a time), in the model's order; the
// names, shapes and dtypes checked against the model of its config (built
// on meta: no memory).
struct StateParameters {
  std::shared_ptr<const StateReader> state;  // (a sharded set: its rank files' headers)
  ModelConfig config;
  std::vector<HfTensorSource> sources;
  std::int64_t count = 0;  // parameters, adapters left out
};
StateParameters state_parameters(const std::string& dir) {
  StateParameters out;
  out.state = std::make_shared<const StateReader>(dir, choose_state_file(dir).path);
  const std::shared_ptr<const StateReader>& state = out.state;
  out.config = state_config(*state);
  DefaultDeviceScope shapes_only(kMeta);
  SkipWeightInit no_values;
  const DecoderModel model(out.config, 0);
  for (const auto& [name, p] : model.named_parameters()) {
    REMAT_CHECK(state->has(name), IOError, state->path(), " is missing parameter '", name, "'");
    // (a frozen parameter loaded from a bf16 / f16 folder is kept, and saved, in that dtype)
    const DType stored = state->dtype(name);
    const bool kept = !p.requires_grad() && (stored == DType::bf16 || stored == DType::f16);
    REMAT_CHECK(state->shape(name) == p.sizes() && (stored == p.dtype() || kept), IOError, "parameter '", name,
                "' in ", state->path(), " is ", shape_str(state->shape(name)), " ", stored, ", expected ",
                shape_str(p.sizes()), " ", p.dtype());
    out.sources.push_back({name, p.sizes(), stored, [state, name = name] { return state->read(name); }});
    if (!is_lora_parameter(name)) out.count += p.numel();
  }
  return out;
}
}  // namespace

std::unique_ptr<DecoderModel> load_trained_model(const std::string& dir, std::map<std::string, std::string>* metadata) {
  const StateChoice choice = choose_state_file(dir);
  const StateReader f(dir, choice.path);  // (a sharded set: its rank files too)
  const ModelConfig c = state_config(f);
  std::unique_ptr<DecoderModel> model;
  {
    SkipWeightInit loaded_next;  // every parameter is read below (or this throws)
    model = std::make_unique<DecoderModel>(c, 0);
  }
  NoGradGuard ng;
  adopt_frozen_dtypes(f, *model);
  for (auto& [name, p] : model->named_parameters()) {
    REMAT_CHECK(f.has(name), IOError, choice.path, " is missing parameter '", name, "'");
    REMAT_CHECK(f.shape(name) == p.sizes() && f.dtype(name) == p.dtype(), IOError, "parameter '", name, "' in ",
                choice.path, " is ", shape_str(f.shape(name)), " ", f.dtype(name), ", expected ",
                shape_str(p.sizes()), " ", p.dtype());
    Tensor dst = p;
    read_state_tensor(f, name, dst);  // (checksum verified)
  }
  model->train(false);
  if (metadata) *metadata = f.metadata();
  return model;
}

std::map<std::string, std::string> export_trained_state(const std::string& dir, const std::string& out,
                                                        const HfExportOptions& options, std::int64_t* parameters) {
  StateParameters st = state_parameters(dir);
  const ModelConfig& c = st.config;
  REMAT_CHECK(!c.lora.enabled() || options.merge_adapter, Error, "export: ", st.state->path(), " is a LoRA fine-tune (",
              c.lora.str(), "): give --merge-adapter for a Hugging Face folder with the adapters merged into the "
              "weights, or --adapter-only for a PEFT adapter folder");
  REMAT_CHECK(c.lora.enabled() || !options.merge_adapter, Error, "export --merge-adapter: ", st.state->path(),
              " has no LoRA adapters to merge");
  if (parameters) *parameters = st.count;
  if (c.lora.enabled()) st.sources = merge_lora(st.sources, c.lora);  // (W + scaling B A, one weight at a time)
  const std::map<std::string, std::string>& meta = st.state->metadata();
  HfExportOptions o = options;
  if (auto t = meta.find("tokenizer"); o.tokenizer.empty() && t != meta.end()) o.tokenizer = t->second;
  save_hf_model(out, without_adapters(c), st.sources, o);
  return meta;
}

std::map<std::string, std::string> export_trained_adapter(const std::string& dir, const std::string& out,
                                                          const std::string& base_model, DType dtype) {
  const StateParameters st = state_parameters(dir);
  REMAT_CHECK(st.config.lora.enabled(), Error, "export --adapter-only: ", st.state->path(),
              " has no LoRA adapters (trained without --lora)");
  std::vector<std::pair<std::string, Tensor>> adapters;  // (small: read whole)
  for (const HfTensorSource& s : st.sources)
    if (is_lora_parameter(s.name)) adapters.emplace_back(s.name, s.read());
  save_adapter(out, st.config.lora, adapters, base_model, dtype);
  return st.state->metadata();
}

}  // namespace remat
