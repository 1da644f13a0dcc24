// Trainer's saved state: save, resume, the one-process layout of the
// parameters, and load_trained_model (train/trainer.h).
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <utility>

#include "engine/grad_mode.h"
#include "engine/rng.h"
#include "models/layers.h"
#include "train/safetensors.h"
#include "train/sharded_state.h"
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
}  // namespace

std::vector<std::pair<std::string, Tensor>> Trainer::parameter_values() const {
  return zero_ ? zero_->parameter_values() : owned_parameters();
}

std::vector<std::pair<std::string, Tensor>> Trainer::one_process_parameters() const {
  std::vector<std::pair<std::string, Tensor>> tensors = gather_experts(parameter_values());
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
  // --zero without a pipeline: every rank writes its own shards, rank 0 the
  // index and the unsharded tensors (train/sharded_state.h). Otherwise one
  // file in the layout of one process, gathered to rank 0.
  const bool sharded = zero_ && !pipeline_;
  std::string index;
  std::vector<std::pair<std::string, Tensor>> tensors;
  if (sharded) {
    const std::string folder = shard_folder_name(dir, step_);
    write_rank_shards(dir, folder, layout_.world->rank(), world_size(), step_, zero_->shard_pieces_named());
    tensors = gather_experts(zero_->unsharded_named());
    layout_.world->barrier();  // every rank file is written before the index commits the set
    index = shard_index(folder, world_size(), step_, zero_->sharded_tensors());
  } else {
    tensors = parameter_values();
    for (auto& t : optimizer_state()) tensors.push_back(t);
    tensors = gather_experts(std::move(tensors));
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

// The state file --resume chose, loaded with every checksum verified; its
// metadata read by key, each failure an IOError naming the file and what
// the previous state offers.
struct ResumedState {
  ResumedState(const std::string& folder, const StateChoice& choice)
      : dir(folder), path(choice.path), from_prev(choice.from_prev) {
    try {
      file = load_safetensors(path);  // every checksum verified before any tensor is built
      complete_sharded_state(folder, file);  // a sharded set: every rank file, verified, assembled
    } catch (const IOError& e) {
      throw IOError(std::string("--resume: ") + e.what() + hint());
    }
  }
  std::string hint() const { return previous_state_hint(dir, from_prev); }
  const std::string& meta(const char* key) const {
    auto it = file.metadata.find(key);
    REMAT_CHECK(it != file.metadata.end(), IOError, "--resume: ", path, " has no metadata '", key, "'", hint());
    return it->second;
  }
  std::uint64_t meta_u64(const char* key) const {
    const std::string& v = meta(key);
    REMAT_CHECK(!v.empty() && v.find_first_not_of("0123456789") == std::string::npos, IOError,
                "--resume: metadata '", key, "' of ", path, " is not a number: '", v, "'", hint());
    return std::stoull(v);
  }
  // Every parameter of `model` is in the file with its shape and dtype.
  void check_parameters(const DecoderModel& model) const {
    for (const auto& [name, p] : model.named_parameters()) {
      auto it = file.tensors.find(name);
      REMAT_CHECK(it != file.tensors.end(), IOError, "--resume: ", path, " is missing parameter '", name, "'", hint());
      REMAT_CHECK(it->second.sizes() == p.sizes() && it->second.dtype() == p.dtype(), IOError, "--resume: parameter '",
                  name, "' in ", path, " is ", shape_str(it->second.sizes()), " ", it->second.dtype(), ", expected ",
                  shape_str(p.sizes()), " ", p.dtype());
    }
  }
  // The saved f16 loss scale (finite, > 0) and its good-step count; nullopt
  // for a state written before loss scaling.
  std::optional<std::pair<double, std::int64_t>> loss_scale() const {
    if (!file.metadata.count("loss_scale")) return std::nullopt;
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
  SafetensorsFile file;
};
}  // namespace

void Trainer::resume(const std::string& dir) {
  resume_notes_.clear();
  StateChoice choice = choose_state_file(dir);
  const ResumedState st(dir, choice);
  const std::string& cur = st.path;
  if (!st.file.checksummed)
    choice.notes.push_back(cur + " has no checksums (written before remat recorded them): loaded without an "
                           "integrity check; the next save adds them");
  REMAT_CHECK(st.meta("format") == kFormat, IOError, "--resume: ", cur, " has format '", st.meta("format"),
              "', expected ", kFormat);
  const ModelConfig saved = ModelConfig::from_json(Json::parse(st.meta("config"), cur + " config"));
  REMAT_CHECK(saved.to_json().dump() == opts_.config.to_json().dump(), IOError, "--resume: ", cur,
              " was trained with config ", saved.to_json().dump(), ", but this run uses ",
              opts_.config.to_json().dump());
  const std::int64_t step = std::int64_t(st.meta_u64("step"));
  st.check_parameters(*model_);  // every parameter before changing anything
  const RngState data{st.meta_u64("data_rng_seed"), st.meta_u64("data_rng_offset")};
  const RngState rng{st.meta_u64("rng_seed"), st.meta_u64("rng_offset")};
  if (zero_)  // this rank's shards of the one-process state
    zero_->load_state(st.file.tensors, step);  // validates, then loads
  else
    optimizer_->load_state(st.file.tensors, step);
  {
    NoGradGuard ng;
    for (auto& [name, p] : model_->named_parameters()) {
      if (p.released()) continue;  // another pipeline stage's, or sharded (--zero 3)
      Tensor dst = p;
      dst.copy_(st.file.tensors.at(name));
    }
  }
  if (zero_) zero_->load_parameters(st.file.tensors);  // --zero 3: this rank's shards
  std::pair<double, std::int64_t> scale{1.0, 0};
  if (const auto saved_scale = st.loss_scale()) {
    scale = *saved_scale;
  } else if (scaler_.enabled()) {
    choice.notes.push_back(cur + " has no loss scale (written before f16 loss scaling): starting from " +
                           format_exact(opts_.loss_scale_init));
    scale.first = opts_.loss_scale_init;
  }
  sampler_->set_state(data);
  default_generator(opts_.device).set_state(rng);
  if (scaler_.enabled()) set_loss_scale(scale.first, scale.second);
  step_ = step;
  resume_notes_ = std::move(choice.notes);
}

std::unique_ptr<DecoderModel> load_trained_model(const std::string& dir, std::map<std::string, std::string>* metadata) {
  const StateChoice choice = choose_state_file(dir);
  SafetensorsFile f = load_safetensors(choice.path);  // checksums verified
  complete_sharded_state(dir, f);                    // (a sharded set: its rank files too)
  auto it = f.metadata.find("format");
  REMAT_CHECK(it != f.metadata.end() && it->second == kFormat, IOError, choice.path,
              " is not a remat training state (metadata format '", it == f.metadata.end() ? "" : it->second,
              "', expected ", kFormat, ")");
  auto cfg = f.metadata.find("config");
  REMAT_CHECK(cfg != f.metadata.end(), IOError, choice.path, " has no metadata 'config'");
  const ModelConfig c = ModelConfig::from_json(Json::parse(cfg->second, choice.path + " config"));
  std::unique_ptr<DecoderModel> model;
  {
    SkipWeightInit loaded_next;  // every parameter is read below (or this throws)
    model = std::make_unique<DecoderModel>(c, 0);
  }
  NoGradGuard ng;
  for (auto& [name, p] : model->named_parameters()) {
    auto t = f.tensors.find(name);
    REMAT_CHECK(t != f.tensors.end(), IOError, choice.path, " is missing parameter '", name, "'");
    REMAT_CHECK(t->second.sizes() == p.sizes() && t->second.dtype() == p.dtype(), IOError, "parameter '", name,
                "' in ", choice.path, " is ", shape_str(t->second.sizes()), " ", t->second.dtype(), ", expected ",
                shape_str(p.sizes()), " ", p.dtype());
    Tensor dst = p;
    dst.copy_(t->second);
  }
  model->train(false);
  if (metadata) *metadata = f.metadata;
  return model;
}

std::map<std::string, std::string> export_trained_state(const std::string& dir, const std::string& out,
                                                        const HfExportOptions& options, std::int64_t* parameters) {
  const StateChoice choice = choose_state_file(dir);
  auto state = std::make_shared<SafetensorsReader>(choice.path);
  const std::map<std::string, std::string>& meta = state->metadata();
  auto it = meta.find("format");
  REMAT_CHECK(it != meta.end() && it->second == kFormat, IOError, choice.path,
              " is not a remat training state (metadata format '", it == meta.end() ? "" : it->second,
              "', expected ", kFormat, ")");
  auto cfg = meta.find("config");
  REMAT_CHECK(cfg != meta.end(), IOError, choice.path, " has no metadata 'config'");
  const ModelConfig c = ModelConfig::from_json(Json::parse(cfg->second, choice.path + " config"));
  auto set = std::make_shared<const std::optional<ShardedSetReader>>(ShardedSetReader::open(dir, meta));
  // The parameters' names and shapes from the model built on meta (no memory).
  std::vector<HfTensorSource> sources;
  {
    DefaultDeviceScope shapes_only(kMeta);
    SkipWeightInit no_values;
    const DecoderModel model(c, 0);
    for (const auto& [name, p] : model.named_parameters()) {
      const bool sharded = *set && (*set)->has(name);
      REMAT_CHECK(sharded || state->has(name), IOError, choice.path, " is missing parameter '", name, "'");
      const Shape stored = sharded ? (*set)->shape(name) : state->shape(name);
      REMAT_CHECK(stored == p.sizes() && (sharded || state->dtype(name) == p.dtype()), IOError, "parameter '", name,
                  "' in ", choice.path, " is ", shape_str(stored), ", expected ", shape_str(p.sizes()), " ",
                  p.dtype());
      sources.push_back({name, p.sizes(), p.dtype(), [set, state, name = name, sharded] {
                           return sharded ? (*set)->read(name) : state->read(name);
                         }});
    }
    if (parameters) *parameters = model.num_parameters();
  }
  HfExportOptions o = options;
  if (auto t = meta.find("tokenizer"); o.tokenizer.empty() && t != meta.end()) o.tokenizer = t->second;
  save_hf_model(out, c, sources, o);
  return meta;
}

}  // namespace remat
