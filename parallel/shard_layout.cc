#include "parallel/shard_layout.h"

#include <algorithm>

#include "engine/grad_mode.h"

namespace remat {

ShardLayout make_shard_layout(std::string name, std::vector<std::string> names, std::vector<Shape> shapes, int ranks) {
  REMAT_CHECK(ranks >= 1, Error, "shard layout of unit '", name, "': ranks must be >= 1, got ", ranks);
  REMAT_CHECK(!names.empty() && names.size() == shapes.size(), Error, "shard layout of unit '", name,
              "': expected one shape per parameter and at least one parameter, got ", names.size(), " name(s) and ",
              shapes.size(), " shape(s)");
  ShardLayout l;
  l.name = std::move(name);
  l.ranks = ranks;
  for (const Shape& s : shapes) {
    l.offsets.push_back(l.numel);
    l.numel += shape_numel(s);
  }
  l.names = std::move(names);
  l.shapes = std::move(shapes);
  l.shard = (l.numel + ranks - 1) / ranks;
  return l;
}

std::vector<ShardPiece> ShardLayout::pieces(int rank) const {
  std::vector<ShardPiece> out;
  const std::int64_t begin = std::int64_t(rank) * shard, end = begin + shard;
  for (std::size_t k = 0; k < names.size(); ++k) {
    const std::int64_t a = std::max(begin, offsets[k]), b = std::min(end, offsets[k] + shape_numel(shapes[k]));
    if (a < b) out.push_back(ShardPiece{k, a - offsets[k], a - begin, b - a});
  }
  return out;
}

namespace {
void check_flat(const ShardLayout& l, const Tensor& t, std::int64_t n, const char* what) {
  REMAT_CHECK(t.defined() && t.dtype() == DType::f32 && t.is_contiguous() && t.numel() == n, ShapeError, what,
              " of unit '", l.name, "': expected a contiguous f32 tensor of ", n, " elements, got ",
              t.defined() ? shape_str(t.sizes()) + " " + dtype_name(t.dtype()) : std::string("none"));
}
void check_members(const ShardLayout& l, const std::vector<Tensor>& members, bool allow_undefined, const char* what) {
  REMAT_CHECK(members.size() == l.names.size(), Error, what, " of unit '", l.name, "': expected ", l.names.size(),
              " member tensors, got ", members.size());
  for (std::size_t k = 0; k < members.size(); ++k) {
    if (allow_undefined && !members[k].defined()) continue;
    REMAT_CHECK(members[k].defined() && members[k].sizes() == l.shapes[k] && members[k].dtype() == DType::f32, ShapeError,
                what, " of unit '", l.name, "': member '", l.names[k], "' must be f32 ", shape_str(l.shapes[k]),
                ", got ", members[k].defined() ? shape_str(members[k].sizes()) : std::string("none"));
  }
}
}  // namespace

void pack_shard(const ShardLayout& l, int rank, const std::vector<Tensor>& members, Tensor& shard) {
  check_members(l, members, false, "pack_shard");
  check_flat(l, shard, l.shard, "pack_shard");
  NoGradGuard ng;
  shard.zero_();
  for (const ShardPiece& p : l.pieces(rank))
    shard.narrow(0, p.shard_begin, p.n).copy_(members[p.member].reshape({-1}).narrow(0, p.param_begin, p.n));
}

Tensor member_view(const ShardLayout& l, const Tensor& flat, std::size_t k) {
  return flat.narrow(0, l.offsets[k], shape_numel(l.shapes[k])).view(l.shapes[k]);
}

void unpack_flat(const ShardLayout& l, const Tensor& flat, const std::vector<Tensor>& members) {
  check_members(l, members, false, "unpack_flat");
  check_flat(l, flat, l.padded(), "unpack_flat");
  NoGradGuard ng;
  for (std::size_t k = 0; k < members.size(); ++k) {
    Tensor dst = members[k];
    dst.copy_(member_view(l, flat, k));
  }
}

}  // namespace remat
