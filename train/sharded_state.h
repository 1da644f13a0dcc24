// Sharded training states (--zero without a pipeline): every rank writes
// its own shards, in parallel, and rank 0's state file is the index.
//
//   DIR/shards-<step>/rank-<r>.safetensors
//        rank r's pieces: 1-D f32 tensors "<tensor>@<first element>", a
//        range of the flattened tensor (parameters and optimizer state),
//        checksummed; metadata: step, rank, ranks
//   DIR/state.safetensors (train/state_files.h, written last)
//        the metadata of the state, the unsharded tensors whole, and
//        "zero_shards": the folder, the ranks, the step, and the name and
//        shape of every sharded tensor
//
// The save writes the rank files (each atomically), then, once all are
// written, rank 0 commits the index through save_state_files, then removes
// the shard folders no state references. So a crash at any point leaves the
// previous complete set (its index is state.safetensors or, during the
// rotation, state.prev.safetensors, and its folder stays until a newer set
// is committed). docs/PARALLEL.md#sharded-states.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "train/safetensors.h"

namespace remat {

inline constexpr const char* kShardIndexKey = "zero_shards";

// The folder a save at `step` writes: "shards-<step>", or "shards-<step>-<k>"
// with the smallest k >= 1 when a state in DIR references that name already
// (a second save at the same step never writes into a committed set). Every
// rank computes the same before the save commits.
std::string shard_folder_name(const std::string& dir, std::int64_t step);

// Writes rank `rank`'s pieces (named "<tensor>@<first element>", 1-D,
// contiguous) to DIR/<folder>/rank-<rank>.safetensors atomically, creating
// the folder; IOError naming the file on failure.
void write_rank_shards(const std::string& dir, const std::string& folder, int rank, int ranks, std::int64_t step,
                       const std::vector<std::pair<std::string, Tensor>>& pieces);

// The index rank 0 stores under kShardIndexKey: `tensors` are the sharded
// tensors' names and whole shapes.
std::string shard_index(const std::string& folder, int ranks, std::int64_t step,
                        const std::vector<std::pair<std::string, Shape>>& tensors);

// A sharded set read a tensor at a time (export streams a sharded state):
// the index and every rank file's header, no tensor data, until read().
class ShardedSetReader {
 public:
  // The set `state_metadata` (of a state file read from DIR) indexes, its
  // rank files opened and checked against the index; nullopt when the state
  // is not sharded. IOError naming the file for a missing rank file, one of
  // another step or set, or a tensor whose pieces do not cover it exactly.
  static std::optional<ShardedSetReader> open(const std::string& dir,
                                              const std::map<std::string, std::string>& state_metadata);
  // The sharded tensors' names, sorted.
  std::vector<std::string> names() const;
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // Its whole shape (IOError for a name the set does not hold).
  const Shape& shape(const std::string& name) const;
  // The tensor, whole (f32, CPU), from its pieces (each checksum verified:
  // IOError naming the file and the piece).
  Tensor read(const std::string& name) const;
  // Elements [begin, begin + dst.numel()) of the flattened tensor into `dst`
  // (contiguous f32 CPU), from the pieces that overlap them only: a piece
  // read whole is verified as it is read, one read in part is verified
  // first (SafetensorsReader::verify). IOError as read(); DTypeError for a
  // range outside the tensor or another kind of `dst`.
  void read_range(const std::string& name, std::int64_t begin, Tensor& dst) const;
  // Verifies the pieces that overlap elements [begin, begin + n) of `name`
  // (their checksums, hashed in bounded chunks; read_range reads them after
  // without hashing again). IOError as read().
  void verify_range(const std::string& name, std::int64_t begin, std::int64_t n) const;

 private:
  ShardedSetReader() = default;
  void open_rank_file(int rank, std::int64_t ranks, std::int64_t step);
  struct Piece {
    std::size_t file;
    std::string piece;
    std::int64_t begin, n;
  };
  struct Sharded {
    Shape shape;
    std::vector<Piece> pieces;
  };
  std::string dir_, folder_;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::string, Sharded> tensors_;
};

// When `file` (a state read from DIR) is a sharded set's index: reads every
// rank file of the set (checksums verified) and adds each sharded tensor,
// whole, to file.tensors. IOError naming the file for a missing or damaged
// rank file, one of another step or set, or a tensor whose pieces do not
// cover it exactly once. Nothing when `file` is not sharded.
void complete_sharded_state(const std::string& dir, SafetensorsFile& file);

// Removes DIR's shard folders that neither DIR/state.safetensors nor
// DIR/state.prev.safetensors references (after a committed save).
void remove_unreferenced_shards(const std::string& dir);

}  // namespace remat
