#include "parallel/grad_reducer.h"

#include <algorithm>
#include <cstring>

#include "engine/autograd.h"

namespace remat {

namespace {
constexpr std::size_t kNone = std::size_t(-1);
}  // namespace

GradReducer::GradReducer(std::vector<ReducedParameter> params, std::int64_t bucket_bytes)
    : params_(std::move(params)), bucket_of_(params_.size(), kNone), ready_(params_.size(), false) {
  REMAT_CHECK(bucket_bytes > 0, Error, "gradient buckets must be > 0 bytes, got ", bucket_bytes);
  // Reverse registration order; one open bucket per (group, deferred) kind.
  std::vector<std::size_t> open;  // indices into buckets_
  for (std::size_t k = params_.size(); k-- > 0;) {
    const ReducedParameter& p = params_[k];
    REMAT_CHECK(p.param.requires_grad() && p.param.dtype() == DType::f32, DTypeError, "gradient reduction: parameter '",
                p.name, "' must be an f32 leaf that requires grad, got ", p.param.dtype());
    if (!p.group || p.group->size() <= 1) continue;
    Bucket* b = nullptr;
    for (std::size_t i : open)
      if (buckets_[i].group == p.group && buckets_[i].deferred == p.ready_may_differ) b = &buckets_[i];
    const std::int64_t n = p.param.numel();
    if (b && !b->offsets.empty() && (b->offsets.back() + params_[b->members.back()].param.numel() + n) * 4 > bucket_bytes) {
      open.erase(std::find(open.begin(), open.end(), std::size_t(b - buckets_.data())));
      b = nullptr;
    }
    if (!b) {
      buckets_.push_back(Bucket{});
      buckets_.back().group = p.group;
      buckets_.back().deferred = p.ready_may_differ;
      open.push_back(buckets_.size() - 1);
      b = &buckets_.back();
    }
    const std::int64_t at = b->offsets.empty() ? 0 : b->offsets.back() + params_[b->members.back()].param.numel();
    b->members.push_back(k);
    b->offsets.push_back(at);
    bucket_of_[k] = std::size_t(b - buckets_.data());
  }
  for (auto& b : buckets_) {
    const std::int64_t n = b.offsets.back() + params_[b.members.back()].param.numel();
    CategoryScope cat(MemoryCategory::gradient);
    b.flat = empty({n}, TensorOptions(DType::f32, params_[b.members.front()].param.device()));
  }
  stats_.buckets = std::int64_t(buckets_.size());
  for (std::size_t k = 0; k < params_.size(); ++k) {
    if (bucket_of_[k] == kNone || buckets_[bucket_of_[k]].deferred) continue;
    // The hook outlives nothing: a reducer that is gone is not called.
    std::weak_ptr<GradReducer*> self = self_;
    params_[k].param.register_post_accumulate_hook([self, k](const Tensor&) {
      if (auto s = self.lock()) (*s)->on_ready(k);
    });
  }
}

void GradReducer::prepare() {
  for (auto& b : buckets_) {
    REMAT_CHECK(!b.work, Error, "GradReducer::prepare: the previous step's reduction was not finished");
    b.pending = std::int64_t(b.members.size());
    b.stale = false;
  }
  std::fill(ready_.begin(), ready_.end(), false);
  start_order_.clear();
  stats_.started_in_backward = 0;
  stats_.bytes = 0;
  armed_ = true;
}

void GradReducer::on_ready(std::size_t k) {
  if (!armed_) return;
  Bucket& b = buckets_[bucket_of_[k]];
  if (ready_[k]) {  // more gradient after this parameter counted as ready
    if (b.work) b.stale = true;
    return;
  }
  ready_[k] = true;
  // Let the started buckets progress while backward goes on.
  for (auto& o : buckets_)
    if (o.work) o.work->test();
  if (--b.pending == 0) {
    start(b);
    stats_.started_in_backward++;
  }
}

void GradReducer::start(Bucket& b) {
  const bool meta = b.flat.device().is_meta();  // shapes only: the gradients' contiguous copies, no values
  float* flat = meta ? nullptr : b.flat.data<float>();
  for (std::size_t i = 0; i < b.members.size(); ++i) {
    const Tensor& p = params_[b.members[i]].param;
    Tensor g = p.grad();
    if (g.defined()) {
      Tensor gc = g.contiguous();
      if (meta) continue;
      std::memcpy(flat + b.offsets[i], gc.data<float>(), std::size_t(p.numel()) * sizeof(float));
    } else if (!meta) {
      std::fill_n(flat + b.offsets[i], p.numel(), 0.0f);
    }
  }
  stats_.bytes += std::int64_t(b.flat.nbytes());
  start_order_.push_back(std::size_t(&b - buckets_.data()));
  b.work = b.group->all_reduce_async(b.flat, ReduceOp::sum);
}

void GradReducer::finish() {
  if (!armed_) return;
  armed_ = false;
  CommPhaseScope phase(CommPhase::backward);  // the end of backward's traffic
  for (auto& b : buckets_)
    if (!b.work) start(b);  // deferred buckets, and buckets with unused parameters
  // Every rank must have started the buckets of each group in the same order.
  std::vector<std::shared_ptr<ProcessGroup>> groups;
  for (const auto& b : buckets_)
    if (std::find(groups.begin(), groups.end(), b.group) == groups.end()) groups.push_back(b.group);
  for (const auto& g : groups) {
    std::vector<std::size_t> order;
    for (std::size_t i : start_order_)
      if (buckets_[i].group == g) order.push_back(i);
    REMAT_CHECK(same_on_every_rank(*g, order), Error, "gradient reduction: the ranks started their gradient buckets in different "
                "orders (their backward passes differ), so the summed gradients would be mixed up");
  }
  for (auto& b : buckets_) {
    b.work->wait();
    b.work.reset();
    if (b.stale) {  // a member's gradient grew after the start: reduce again
      start(b);
      b.work->wait();
      b.work.reset();
    }
    const bool meta = b.flat.device().is_meta();
    const float* flat = meta ? nullptr : b.flat.data<float>();
    for (std::size_t i = 0; i < b.members.size(); ++i) {
      const Tensor& p = params_[b.members[i]].param;
      Tensor g = p.grad();
      if (!g.defined() || !g.is_contiguous()) {
        CategoryScope cat(MemoryCategory::gradient);
        g = empty(p.sizes(), TensorOptions(DType::f32, p.device()));
        p.set_grad(g);
      }
      if (meta) continue;
      std::memcpy(g.data<float>(), flat + b.offsets[i], std::size_t(p.numel()) * sizeof(float));
      g.bump_version();
    }
  }
}

}  // namespace remat
