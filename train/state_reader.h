// A training state's tensors, read one at a time or by element range, never
// the whole state at once: the state file (train/state_files.h) and, when it
// indexes a sharded set, the rank files (train/sharded_state.h). Resume,
// load_trained_model and export read states through it, so a process holds
// at most the tensor (or range) it is reading besides its own buffers.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "train/safetensors.h"
#include "train/sharded_state.h"

namespace remat {

class StateReader {
 public:
  // Opens the state file `path` (of the --resume / --save folder `dir`):
  // its header, and when it indexes a sharded set every rank file's header,
  // checked against the index. No tensor data is read. IOError naming the
  // file for one that is missing, damaged or of another set.
  StateReader(const std::string& dir, const std::string& path);

  const std::string& path() const { return file_.path(); }
  const std::map<std::string, std::string>& metadata() const { return file_.metadata(); }
  // The state file carries checksums (rank files always do).
  bool checksummed() const { return file_.checksummed(); }
  // Whether the state holds tensor `name` (whole in the state file or in shards).
  bool has(const std::string& name) const;
  // Its shape and dtype (sharded tensors are f32); IOError naming the file
  // and the tensor when absent.
  const Shape& shape(const std::string& name) const;
  DType dtype(const std::string& name) const;
  // The tensor, whole, on the CPU in its stored dtype.
  Tensor read(const std::string& name) const;
  // Elements [begin, begin + dst.numel()) of the flattened tensor into
  // `dst` (contiguous, CPU, the stored dtype or f32). Every byte read comes
  // from a tensor or piece whose checksum was verified (a partial read
  // hashes the whole stored tensor first, in bounded chunks). IOError for a
  // checksum mismatch or a short read, DTypeError for a range outside it.
  void read_range(const std::string& name, std::int64_t begin, Tensor& dst) const;
  // Checks the stored bytes elements [begin, begin + n) of `name` come from
  // (the tensor, or the pieces that overlap them) against their checksums,
  // hashing in bounded chunks; reads of them afterwards hash nothing again.
  // A reader that must change nothing on a damaged state verifies every
  // range first. IOError naming the file and the tensor or piece.
  void verify_range(const std::string& name, std::int64_t begin, std::int64_t n) const;

 private:
  SafetensorsReader file_;
  std::optional<ShardedSetReader> set_;
};

// Loads `name`'s values from `reader` into `dst` (a tensor of its shape, on
// any device, the stored dtype or f32): read in place when `dst` is a
// contiguous CPU tensor, else through one CPU copy of the tensor.
void read_state_tensor(const StateReader& reader, const std::string& name, Tensor& dst);

}  // namespace remat
