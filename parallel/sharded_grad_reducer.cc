#include "parallel/sharded_grad_reducer.h"

#include <algorithm>
#include <chrono>

#include "engine/allocator.h"
#include "engine/grad_mode.h"
#include "ops/inplace.h"

namespace remat {

ShardedGradReducer::ShardedGradReducer(std::vector<ShardedUnit> units, std::shared_ptr<ProcessGroup> group)
    : units_(std::move(units)), group_(std::move(group)) {
  REMAT_CHECK(group_ != nullptr, Error, "sharded gradient reduction: no process group");
  const std::size_t U = units_.size();
  ready_.resize(U);
  pending_.assign(U, 0);
  reduced_.assign(U, false);
  stale_.assign(U, false);
  for (std::size_t u = 0; u < U; ++u) {
    const ShardedUnit& unit = units_[u];
    REMAT_CHECK(unit.layout.ranks == group_->size() && unit.params.size() == unit.layout.names.size(), Error,
                "sharded gradient reduction: unit '", unit.layout.name, "' is laid out over ", unit.layout.ranks,
                " rank(s) with ", unit.layout.names.size(), " member(s), but the group has ", group_->size(),
                " rank(s) and the unit ", unit.params.size(), " parameter(s)");
    for (std::size_t k = 0; k < unit.params.size(); ++k) {
      const Tensor& p = unit.params[k];
      REMAT_CHECK(p.requires_grad() && p.dtype() == DType::f32 && p.sizes() == unit.layout.shapes[k], DTypeError,
                  "sharded gradient reduction: parameter '", unit.layout.names[k], "' of unit '", unit.layout.name,
                  "' must be an f32 leaf of shape ", shape_str(unit.layout.shapes[k]), " that requires grad, got ",
                  p.dtype(), " ", shape_str(p.sizes()));
    }
    ready_[u].assign(unit.params.size(), false);
    {
      CategoryScope cat(MemoryCategory::gradient);
      shards_.push_back(zeros({unit.layout.shard}, TensorOptions(DType::f32, unit.params.front().device())));
    }
    for (std::size_t k = 0; k < unit.params.size(); ++k) {
      std::weak_ptr<ShardedGradReducer*> self = self_;  // a reducer that is gone is not called
      unit.params[k].set_grad_placement([self, u, k](const Tensor&) {
        auto s = self.lock();
        return s ? (*s)->place(u, k) : Tensor();
      });
      if (unit.ready_may_differ) continue;
      unit.params[k].register_post_accumulate_hook([self, u, k](const Tensor&) {
        if (auto s = self.lock()) (*s)->on_ready(u, k);
      });
    }
  }
  flat_.resize(U);
}

Tensor ShardedGradReducer::place(std::size_t u, std::size_t k) {
  if (!armed_) return Tensor();  // a backward the reducer does not run: a plain copy
  const ShardLayout& l = units_[u].layout;
  if (!flat_[u].defined()) {
    CategoryScope cat(MemoryCategory::gradient);
    flat_[u] = empty({l.padded()}, TensorOptions(DType::f32, units_[u].params.front().device()));
  }
  return member_view(l, flat_[u], k);
}

Tensor ShardedGradReducer::take_flat(std::size_t u) {
  ShardedUnit& unit = units_[u];
  const ShardLayout& l = unit.layout;
  Tensor flat = std::move(flat_[u]);
  flat_[u] = Tensor();
  CategoryScope cat(MemoryCategory::gradient);
  if (!flat.defined()) flat = empty({l.padded()}, TensorOptions(DType::f32, unit.params.front().device()));
  NoGradGuard ng;
  if (l.padded() > l.numel) flat.narrow(0, l.numel, l.padded() - l.numel).zero_();
  for (std::size_t k = 0; k < unit.params.size(); ++k) {
    Tensor part = member_view(l, flat, k);
    const Tensor g = unit.params[k].grad();
    const bool placed = g.shares_storage_with(flat) && g.storage_offset() == part.storage_offset() && g.is_contiguous();
    if (!g.defined())
      part.zero_();  // no gradient reached this member
    else if (!placed)
      part.copy_(g);  // a gradient set outside the placement
    unit.params[k].set_grad(Tensor());  // the full gradients go with the flat array
  }
  return flat;
}

void ShardedGradReducer::zero() {
  NoGradGuard ng;
  for (Tensor& s : shards_) s.zero_();
  order_.clear();
  stats_ = ShardedGradStats{};
}

void ShardedGradReducer::prepare() {
  for (std::size_t u = 0; u < units_.size(); ++u) {
    std::fill(ready_[u].begin(), ready_[u].end(), false);
    pending_[u] = std::int64_t(units_[u].params.size());
    reduced_[u] = stale_[u] = false;
  }
  armed_ = true;
}

void ShardedGradReducer::on_ready(std::size_t u, std::size_t k) {
  if (!armed_) return;
  if (ready_[u][k]) {  // more gradient after this member counted as ready
    if (reduced_[u]) stale_[u] = true;
    return;
  }
  ready_[u][k] = true;
  if (--pending_[u] == 0) {
    reduce(u);
    stats_.started_in_backward++;
  }
}

void ShardedGradReducer::reduce(std::size_t u) {
  ShardedUnit& unit = units_[u];
  Tensor part;
  {
    Tensor flat = take_flat(u);
    CategoryScope cat(MemoryCategory::gradient);
    const auto t0 = std::chrono::steady_clock::now();
    part = group_->reduce_scatter(flat, ReduceOp::sum);
    stats_.wait_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  }
  NoGradGuard ng;
  add_(shards_[u], part);
  reduced_[u] = true;
  order_.push_back(u);
  stats_.reduce_scatters++;
  stats_.bytes += unit.layout.padded() * std::int64_t(sizeof(float));
}

void ShardedGradReducer::finish() {
  if (!armed_) return;
  armed_ = false;
  CommPhaseScope phase(CommPhase::backward);  // the end of backward's traffic
  for (std::size_t u = 0; u < units_.size(); ++u) {
    if (!reduced_[u]) {
      reduce(u);  // deferred units, and units a parameter of which got no gradient
      continue;
    }
    if (stale_[u]) reduce(u);  // gradient added after the reduction: reduce that part too
  }
  // Every rank must have reduced the units in the same order.
  REMAT_CHECK(same_on_every_rank(*group_, order_), Error, "sharded gradient reduction: the ranks reduce-scattered their units in different "
              "orders (their backward passes differ), so the summed gradients would be mixed up");
}

}  // namespace remat
