#include "train/hf_model.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/grad_mode.h"
#include "train/file_io.h"
#include "train/hf_files.h"
#include "train/safetensors.h"

namespace remat {

namespace fs = std::filesystem;

namespace {


// Up to `n` names of a list and how many there are.
std::string some(const std::vector<std::string>& names, std::size_t n = 8) {
  std::string s;
  for (std::size_t i = 0; i < names.size() && i < n; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > n) s += ", ... (" + std::to_string(names.size()) + " in all)";
  return s;
}

const char* hf_dtype_name(DType t) {
  switch (t) {
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    default: return "float32";
  }
}

}  // namespace

bool is_hf_model_dir(const std::string& dir) {
  struct stat st;
  return ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && ::stat((dir + "/config.json").c_str(), &st) == 0;
}

bool has_tokenizer_files(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / "tokenizer.json", ec) || fs::is_regular_file(fs::path(dir) / "tokenizer.model", ec);
}

HfConfig load_hf_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  REMAT_CHECK(is_hf_model_dir(dir), IOError, "--model ", dir, ": not a Hugging Face model folder (no ", path, ")");
  HfConfig h = config_from_hf(Json::parse(file_io::read_file(path), path), path);
  h.config.name = fs::path(dir).filename().string();
  if (h.config.name.empty()) h.config.name = fs::path(dir).parent_path().filename().string();
  return h;
}

std::string hf_weights_dtype(const std::string& dir) {
  const CheckpointFiles files(dir);
  std::map<DType, std::uint64_t> bytes;
  for (const std::string& n : files.names())
    if (is_floating(files.dtype(n))) bytes[files.dtype(n)] += files.nbytes(n);
  DType best = DType::f32;
  std::uint64_t most = 0;
  for (const auto& [t, b] : bytes)
    if (b > most) best = t, most = b;
  return hf_dtype_name(best);
}

void load_hf_weights(DecoderModel& model, const std::string& dir) {
  const CheckpointFiles files(dir);
  const auto params = model.named_parameters();
  std::set<std::string> mine;
  std::vector<std::string> missing, misshapen, unexpected, bad_dtype;
  for (const auto& [name, p] : params) {
    mine.insert(name);
    if (is_lora_parameter(name) && !files.has(name)) continue;  // (an adapter: its own initial values)
    if (!files.has(name)) {
      missing.push_back(name + " " + shape_str(p.sizes()));
      continue;
    }
    if (files.shape(name) != p.sizes())
      misshapen.push_back(name + " is " + shape_str(files.shape(name)) + ", the model needs " + shape_str(p.sizes()));
    if (!is_floating(files.dtype(name)))
      bad_dtype.push_back(name + " (" + dtype_name(files.dtype(name)) + ")");
  }
  // Routed experts another expert-parallel rank holds are expected, not unexpected.
  for (const std::string& name : files.names())
    if (!mine.count(name) && !held_by_another_rank(model, name)) unexpected.push_back(name);
  if (!missing.empty() || !misshapen.empty() || !unexpected.empty() || !bad_dtype.empty()) {
    std::string msg = "--model " + dir + ": the weights do not match config.json's " +
                      (model.config().arch.empty() ? std::string("model") : model.config().arch) + " model:";
    if (!missing.empty()) msg += "\n  missing " + std::to_string(missing.size()) + ": " + some(missing);
    if (!unexpected.empty())
      msg += "\n  unexpected " + std::to_string(unexpected.size()) + " (not parameters of this model): " + some(unexpected);
    if (!misshapen.empty()) msg += "\n  mis-shaped " + std::to_string(misshapen.size()) + ": " + some(misshapen, 4);
    if (!bad_dtype.empty()) msg += "\n  not floating point: " + some(bad_dtype);
    throw IOError(msg);
  }
  // A frozen parameter keeps the folder's bf16 / f16: no f32 master (the
  // layers cast it to the compute dtype as they cast any weight).
  keep_frozen_in_folder_dtypes(model, dir);
  NoGradGuard ng;
  CategoryScope cat(MemoryCategory::parameter);
  // A model on meta has no values to fill: the folder's config.json and
  // headers, checked above, are all it reads (docs/META.md).
  if (!params.empty() && params.front().second.device().is_meta()) return;
  for (const auto& [name, p] : params) {
    if (!files.has(name)) continue;  // (an adapter)
    Tensor dst = p;
    if (dst.dtype() != DType::f32)
      dst.copy_(files.read(name, dst.dtype()));
    else if (dst.device().is_cpu() && dst.is_contiguous())
      files.read_into(name, dst);  // straight into the parameter: no temporary
    else
      dst.copy_(files.read(name, DType::f32));  // one tensor held at a time
  }
}

void keep_frozen_in_folder_dtypes(const DecoderModel& model, const std::string& dir) {
  const CheckpointFiles files(dir);
  NoGradGuard ng;
  CategoryScope cat(MemoryCategory::parameter);
  bool converted = false;
  Device device = kCPU;
  for (const auto& [name, p] : model.named_parameters()) {
    if (!files.has(name) || p.requires_grad()) continue;
    const DType t = files.dtype(name);
    if ((t != DType::bf16 && t != DType::f16) || p.dtype() == t) continue;
    Tensor frozen = p;
    frozen.convert_(t);
    converted = true;
    device = p.device();
  }
  if (converted) allocator_for(device).empty_cache();  // (the f32 blocks they left)
}

bool held_by_another_rank(const DecoderModel& model, const std::string& name) {
  const RoutedExpertName r = routed_expert_name(name);
  const auto& layers = model.model->layers;
  if (r.layer < 0 || r.layer >= std::int64_t(layers.size()) || r.expert >= model.config().experts) return false;
  const auto& moe = layers[std::size_t(r.layer)]->moe;
  return moe && (r.expert < moe->first_expert() || r.expert >= moe->first_expert() + std::int64_t(moe->experts.size()));
}

std::unique_ptr<DecoderModel> load_hf_model(const std::string& dir, std::int64_t batch, std::int64_t seq,
                                            Device device, const LoraConfig& lora) {
  ModelConfig c = load_hf_config(dir).config;
  c.batch = batch;
  c.seq = seq;
  c.lora = lora;
  c.validate();
  std::unique_ptr<DecoderModel> model;
  {
    SkipWeightInit loaded_next;  // every parameter is read below
    DefaultDeviceScope on(device);
    model = std::make_unique<DecoderModel>(c, 0);
  }
  load_hf_weights(*model, dir);
  return model;
}

DType hf_dtype_from_name(const std::string& name) {
  if (name == "f32" || name == "float32") return DType::f32;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "f16" || name == "float16") return DType::f16;
  throw Error("weights dtype '" + name + "': expected f32, bf16 or f16");
}

void save_hf_model(const std::string& dir, const ModelConfig& c,
                   const std::vector<std::pair<std::string, Tensor>>& parameters, const HfExportOptions& options) {
  save_hf_model(dir, c, hf_sources(parameters), options);
}

void save_hf_model(const std::string& dir, const ModelConfig& c, const std::vector<HfTensorSource>& parameters,
                   const HfExportOptions& options) {
  REMAT_CHECK(!c.lora.enabled(), Error, "export: the model has LoRA adapters (", c.lora.str(), "), which a Hugging "
              "Face model folder cannot hold: merge them into the weights (export --merge-adapter) or write them as "
              "an adapter folder (train --save-adapter)");
  const Json config = config_to_hf(c, hf_dtype_name(options.dtype));  // refuses what HF cannot express
  std::error_code ec;
  fs::create_directories(dir, ec);
  REMAT_CHECK(!ec, IOError, "export: cannot create ", dir, ": ", ec.message());
  // A folder with a config.json reads as a complete model: an old one goes
  // first and the new one comes last, so an interrupted export leaves the
  // old model or a folder that refuses to open, never new weights under an
  // old config.
  if (fs::remove(dir + "/config.json", ec)) fsync_dir(dir);
  REMAT_CHECK(!ec, IOError, "export: cannot remove ", dir, "/config.json: ", ec.message());
  export_fault_point(ExportStep::cleared);
  save_hf_checkpoint(dir, parameters, options.dtype, options.max_shard_bytes);
  if (!options.tokenizer.empty()) {
    const fs::path src(options.tokenizer);
    std::vector<fs::path> files;
    if (fs::is_directory(src)) {
      for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                            "generation_config.json", "vocab.json", "merges.txt"})
        if (fs::exists(src / f)) files.push_back(src / f);
    } else {
      REMAT_CHECK(fs::exists(src), IOError, "export: tokenizer ", options.tokenizer, " does not exist");
      files.push_back(src);
      for (const char* f : {"tokenizer_config.json", "special_tokens_map.json", "generation_config.json"})
        if (fs::exists(src.parent_path() / f)) files.push_back(src.parent_path() / f);
    }
    REMAT_CHECK(!files.empty(), IOError, "export: no tokenizer files in ", options.tokenizer);
    for (const fs::path& f : files) write_file_atomic(dir + "/" + f.filename().string(), file_io::read_file(f.string()));
  }
  export_fault_point(ExportStep::tokenizer);
  write_file_atomic(dir + "/config.json", config.dump() + "\n");  // last: a folder with a config is complete
  export_fault_point(ExportStep::done);
}

}  // namespace remat
