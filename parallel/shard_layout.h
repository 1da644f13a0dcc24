// Flat sharding of a unit of parameters over the ranks of a group (ZeRO):
// the unit's parameters laid end to end as one flat array of `numel`
// elements, padded with zeros to `padded` (a multiple of the ranks), rank r
// owning elements [r * shard, (r + 1) * shard). A parameter may straddle
// two ranks' shards; the pieces of one rank are the intersections of its
// range with each parameter. docs/PARALLEL.md#sharded-data-parallel-zero.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace remat {

// One parameter's part of a rank's shard: elements [param_begin,
// param_begin + n) of parameter `member` (flattened) are elements
// [shard_begin, shard_begin + n) of the shard.
struct ShardPiece {
  std::size_t member = 0;
  std::int64_t param_begin = 0;
  std::int64_t shard_begin = 0;
  std::int64_t n = 0;
};

struct ShardLayout {
  std::string name;                   // the unit ("embed", "block.3", "head")
  std::vector<std::string> names;     // the members' parameter names, in order
  std::vector<Shape> shapes;          // ... and shapes
  std::vector<std::int64_t> offsets;  // each member's first element in the flat array
  std::int64_t numel = 0;             // the members' elements together
  std::int64_t shard = 0;             // elements per rank: ceil(numel / ranks)
  int ranks = 1;
  std::int64_t padded() const { return shard * ranks; }
  // The pieces of rank `rank`'s shard, in flat order (empty for a rank whose
  // shard is all padding).
  std::vector<ShardPiece> pieces(int rank) const;
};

// The layout of parameters `names` with `shapes` (in that order) over
// `ranks` ranks; Error for ranks < 1 or no parameters.
ShardLayout make_shard_layout(std::string name, std::vector<std::string> names, std::vector<Shape> shapes, int ranks);

// Member k's elements of a flat array of the unit (layout.padded()
// elements of any dtype, contiguous), as a view in the member's shape.
Tensor member_view(const ShardLayout& layout, const Tensor& flat, std::size_t k);
// Copies rank `rank`'s shard of the members (contiguous f32 tensors, one per
// member, in order) into `shard` (f32, layout.shard elements; padding set
// to 0).
void pack_shard(const ShardLayout& layout, int rank, const std::vector<Tensor>& members, Tensor& shard);
// Copies a whole flat array (layout.padded() f32 elements, e.g. an
// all-gather of every rank's shard) into the members (contiguous f32).
void unpack_flat(const ShardLayout& layout, const Tensor& flat, const std::vector<Tensor>& members);

}  // namespace remat
