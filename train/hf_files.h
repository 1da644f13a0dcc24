// Hugging Face checkpoint folders, read and written a tensor at a time.
//
// A folder holds either one file, `model.safetensors`, or shards
// `model-00001-of-0000N.safetensors` ... `model-0000N-of-0000N.safetensors`
// (5 digits each) and the index `model.safetensors.index.json`:
//   {"metadata": {"total_size": BYTES}, "weight_map": {"tensor name": "shard file name", ...}}
// (docs/REFERENCE.md#file-formats). Shards are plain safetensors files (remat's
// reader accepts them with or without remat's checksums; the writer adds none).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"
#include "train/safetensors.h"

namespace remat {

inline constexpr const char* kHfSingleFile = "model.safetensors";
inline constexpr const char* kHfIndexFile = "model.safetensors.index.json";

// "model-00002-of-00005.safetensors" for (2, 5).
std::string hf_shard_name(int index, int count);

// A parsed model.safetensors.index.json.
struct HfIndex {
  std::map<std::string, std::string> weight_map;  // tensor -> shard file (a plain file name)
  std::optional<std::int64_t> total_size;         // metadata.total_size, when given
};

// Parses the text of an index (see CheckpointFiles for its form): a JSON
// object whose "weight_map" maps each tensor to a plain file name (not
// empty, ".", "..", nor holding '/' or NUL) and whose "metadata", when
// present, is an object whose "total_size", when present, is a non-negative
// integer. Throws IOError "WHAT: why" (`what`: the index's path).
HfIndex parse_hf_index(const std::string& text, const std::string& what);

// The tensors of a Hugging Face checkpoint folder. The constructor opens the
// folder's `model.safetensors` (preferred when both exist, as transformers
// does) or its index and every shard the index names, reads and validates
// every header (SafetensorsReader) and the index against them: the index is
// a JSON object whose "weight_map" maps each tensor to a plain file name in
// the folder and whose "metadata", when present, is an object whose
// "total_size", when present, is a non-negative integer; every shard exists
// and parses; every tensor of the weight_map is in the file it names; no
// shard holds a tensor the weight_map does not list or maps to another file
// (a tensor in two files). No tensor data is read. Errors are IOError naming
// the folder or file and the tensor. Shards stay open; read() is const and
// may run from several threads.
class CheckpointFiles {
 public:
  explicit CheckpointFiles(std::string dir);

  const std::string& dir() const { return dir_; }
  // True when the folder is sharded (read through the index).
  bool sharded() const { return sharded_; }
  // The data files, in the order the folder names them (one when not sharded).
  const std::vector<std::string>& files() const { return files_; }
  // Tensor names, sorted.
  std::vector<std::string> names() const;
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  // The file (name within the folder) holding `name`.
  const std::string& file_of(const std::string& name) const;
  const Shape& shape(const std::string& name) const;
  DType dtype(const std::string& name) const;
  std::size_t nbytes(const std::string& name) const;
  // Sum of every tensor's stored bytes.
  std::uint64_t total_bytes() const;
  // One tensor (SafetensorsReader::read of its shard). Unknown name: IOError
  // naming the folder and the tensor.
  Tensor read(const std::string& name, std::optional<DType> as = {}) const;
  // SafetensorsReader::read_into of its shard (no temporary tensor).
  void read_into(const std::string& name, Tensor& dst) const;
  // SafetensorsReader::read_range_into of its shard (a rank's slice).
  void read_range_into(const std::string& name, std::int64_t begin, Tensor& dst) const;

 private:
  const SafetensorsReader& reader_of(const std::string& name) const;

  std::string dir_;
  bool sharded_ = false;
  std::vector<std::string> files_;
  std::vector<SafetensorsReader> readers_;       // parallel to files_
  std::map<std::string, std::size_t> where_;     // tensor -> index into files_
};

// The steps of a Hugging Face export, in order; a fault hook runs after each.
enum class ExportStep {
  cleared,    // save_hf_model: config.json removed (the folder no longer reads as a model)
  shard,      // save_hf_checkpoint: one weights file in place (once per file)
  weights,    // save_hf_checkpoint: every weights file and the index written, stale shards removed
  tokenizer,  // save_hf_model: the tokenizer's files copied (also when there are none)
  done,       // save_hf_model: config.json written, the export is complete
};

// Fault injection for tests: `hook` runs after each step of every export in
// this process (on the thread that exports); it may throw (the export stops
// there, leaving the files as a crash would). An empty hook removes it.
// Thread-safe.
using ExportFaultHook = std::function<void(ExportStep)>;
void set_export_fault_hook(ExportFaultHook hook);
// Runs the hook, if any, for `step` (save_hf_checkpoint and save_hf_model call it).
void export_fault_point(ExportStep step);

// Writes `tensors` to the folder `dir` (created if missing) as a Hugging Face
// checkpoint: floating tensors converted to `dtype` (f32, bf16 or f16; round
// to nearest even), other dtypes as they are; in the given order, packed into
// shards of at most `max_shard_bytes` tensor bytes each (a tensor larger than
// that gets a shard of its own). One shard is written as `model.safetensors`
// without an index; several as `model-0000I-of-0000N.safetensors` plus
// `model.safetensors.index.json` (total_size = the sum of the tensors'
// bytes). Every file has "__metadata__" {"format": "pt"} and no checksums.
//
// One tensor is converted and held at a time: each file is streamed to a
// temporary file, fsynced and renamed into place (as write_file_atomic).
// The folder never mixes exports: the old index (and, for a sharded export,
// an old model.safetensors) is removed before anything is written and the
// new index is written last, so an interrupted export leaves the old
// checkpoint, the new one, or a folder CheckpointFiles refuses; then shards
// and temporary files of earlier exports that the new one did not write are
// removed (other files in the folder stay). Names must be unique, non-empty
// and not "__metadata__"; tensors defined. Throws IOError (DTypeError for
// `dtype`).
void save_hf_checkpoint(const std::string& dir, const std::vector<std::pair<std::string, Tensor>>& tensors,
                        DType dtype, std::int64_t max_shard_bytes);

// A tensor an export reads when it writes it (never before): its name,
// shape and dtype up front (the headers are planned from them), its values
// from `read` (a tensor of that shape and dtype, on any device).
struct HfTensorSource {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  std::function<Tensor()> read;
};
// `tensors` as sources that return them.
std::vector<HfTensorSource> hf_sources(const std::vector<std::pair<std::string, Tensor>>& tensors);
// save_hf_checkpoint over sources: each is read when its shard is written
// and dropped after, so memory holds one tensor at a time (a sharded
// training state exports without ever holding the model). IOError as
// above, and when a source reads another size than its shape.
void save_hf_checkpoint(const std::string& dir, const std::vector<HfTensorSource>& tensors, DType dtype,
                        std::int64_t max_shard_bytes);

}  // namespace remat
