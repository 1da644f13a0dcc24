#include "train/zero_gather.h"

#include <any>
#include <chrono>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/grad_mode.h"
#include "engine/recompute_context.h"
#include "models/layers.h"
#include "ops/ops.h"

namespace remat {

namespace {
constexpr std::size_t kNone = std::size_t(-1);

// A saved parameter, kept as where it lies in its unit's gathered array.
struct ParamRef {
  std::size_t unit = 0;
  Shape sizes, strides;
  std::int64_t offset = 0;
};
}  // namespace

// Saves that alias a gathered unit become references to it.
class UnitGatherer::SaveRefs final : public TypedSavedTensorHooks {
 public:
  explicit SaveRefs(UnitGatherer& owner) : owner_(owner) {}
  std::string name() const override { return "zero-3 parameter references"; }
  bool wants(const Tensor& t, const SaveInfo&) const override { return unit_of(t) != kNone; }
  std::any pack_tensor(const Tensor& t, const SaveInfo&) override {
    return ParamRef{unit_of(t), t.sizes(), t.strides(), t.storage_offset()};
  }
  Tensor unpack_tensor(std::any packed, const SaveInfo&) override {
    const auto& r = std::any_cast<const ParamRef&>(packed);
    owner_.gather_for_backward(r.unit);  // (nothing when backward already gathered it)
    return owner_.units_[r.unit].flat.as_strided(r.sizes, r.strides, r.offset);
  }

 private:
  std::size_t unit_of(const Tensor& t) const {
    if (!t.defined() || !t.impl().storage) return kNone;
    for (std::size_t u = 0; u < owner_.units_.size(); ++u) {
      const Tensor& flat = owner_.units_[u].flat;
      if (flat.defined() && flat.impl().storage == t.impl().storage) return u;
    }
    return kNone;
  }
  UnitGatherer& owner_;
};

UnitGatherer::UnitGatherer(std::vector<Unit> units, std::shared_ptr<ProcessGroup> group) : group_(std::move(group)) {
  for (Unit& u : units) {
    REMAT_CHECK(u.layout.ranks == group_->size() && u.master.numel() == u.layout.shard, Error, "zero-3: unit '",
                u.layout.name, "' has a shard of ", u.master.numel(), " elements over ", u.layout.ranks,
                " rank(s); expected ", u.layout.shard, " over ", group_->size());
    by_name_[u.layout.name] = units_.size();
    State s;
    static_cast<Unit&>(s) = std::move(u);
    for (const Tensor& p : s.params) p.release_storage();
    units_.push_back(std::move(s));
  }
  saves_ = std::make_shared<SaveRefs>(*this);
}

UnitGatherer::~UnitGatherer() {
  try {
    release_all();
  } catch (...) {  // (a prefetch's wait failing: the job is ending anyway)
  }
}

void UnitGatherer::set_dtype(std::size_t u, DType dtype) {
  State& s = units_[u];
  REMAT_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, DTypeError, "zero-3: unit '",
              s.layout.name, "' can gather in f32, bf16 or f16, not ", dtype);
  REMAT_CHECK(!s.flat.defined() && !s.work, Error, "zero-3: unit '", s.layout.name,
              "' changes its gathered dtype while gathered");
  s.dtype = dtype;
}

void UnitGatherer::install() {
  std::weak_ptr<UnitGatherer> self = weak_from_this();
  for (std::size_t u = 0; u < units_.size(); ++u)
    for (std::size_t k = 0; k < units_[u].params.size(); ++k)
      if (units_[u].counted[k])
        units_[u].params[k].register_post_accumulate_hook([self, u, k](const Tensor&) {
          if (auto s = self.lock()) s->on_grad(u, k);
        });
}

std::size_t UnitGatherer::index(const std::string& unit) const {
  auto it = by_name_.find(unit);
  return it == by_name_.end() ? kNone : it->second;
}

void UnitGatherer::prefetch(std::size_t u) {
  State& s = units_[u];
  if (s.flat.defined() || s.work) return;
  {
    NoGradGuard ng;
    CategoryScope cat(MemoryCategory::parameter);  // (offload and compression leave parameters alone)
    s.incoming = empty({s.layout.padded()}, TensorOptions(s.dtype, s.master.device()));
    if (s.dtype != DType::f32) s.sent = cast(s.master, s.dtype);
  }
  s.work = group_->all_gather_async(s.dtype == DType::f32 ? s.master : s.sent, s.incoming);
  ++gathers_;
}

void UnitGatherer::progress() {
  for (State& s : units_)
    if (s.work) s.work->test();
}

void UnitGatherer::gather(std::size_t u) {
  State& s = units_[u];
  if (s.flat.defined()) return;
  prefetch(u);
  const auto t0 = std::chrono::steady_clock::now();
  s.work->wait();
  wait_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  s.work.reset();
  s.sent = Tensor();
  s.flat = std::move(s.incoming);
  s.incoming = Tensor();
  for (std::size_t k = 0; k < s.params.size(); ++k) {
    Tensor member = member_view(s.layout, s.flat, k);
    if (s.dtype == DType::f32)
      s.params[k].alias_storage_(member);
    else
      set_gathered_copy(s.params[k], member);
  }
  s.got.assign(s.params.size(), false);
  s.pending = 0;
  for (bool c : s.counted) s.pending += c ? 1 : 0;
}

void UnitGatherer::release(std::size_t u) {
  State& s = units_[u];
  if (s.work) {  // a prefetch nothing used (the step ended first)
    s.work->wait();
    s.work.reset();
    s.incoming = s.sent = Tensor();
  }
  if (!s.flat.defined()) return;
  for (const Tensor& p : s.params) {
    if (s.dtype == DType::f32)
      p.release_storage();
    else
      clear_gathered_copy(p);
  }
  s.flat = Tensor();
}

void UnitGatherer::release_all() {
  for (std::size_t u = 0; u < units_.size(); ++u) release(u);
}

void UnitGatherer::before_run(const std::string& unit) {
  const std::size_t u = index(unit);
  if (u == kNone) return;
  progress();
  gather(u);
  // The forward runs the units in order; a replay runs inside backward,
  // where the block before it is next (gather_for_backward prefetches it).
  if (!in_recompute() && u + 1 < units_.size()) prefetch(u + 1);
}

void UnitGatherer::gather_for_backward(std::size_t u) {
  gather(u);
  // Backward runs the blocks in reverse; an embedding's backward needs no
  // weight (it is gathered only if a save of it is unpacked).
  if (u >= 1 && units_[u - 1].layout.name != "embed") prefetch(u - 1);
}

void UnitGatherer::after_run(const std::string& unit, const Tensor& y) {
  const std::size_t u = index(unit);
  if (u == kNone || in_recompute()) return;  // a replay: its block's backward follows
  // A block's backward may start with a replay of one of its parts, which
  // reads the parameters directly: gather when the gradient reaches the
  // block's output.
  if (unit.rfind("block.", 0) == 0 && grad_enabled() && y.requires_grad()) {
    std::weak_ptr<UnitGatherer> self = weak_from_this();
    y.register_hook([self, u](const Tensor&) -> Tensor {
      if (auto s = self.lock()) s->gather_for_backward(u);
      return Tensor();
    });
  }
  if (stack_ && unit.rfind("block.", 0) == 0 && stack_->plan().keeps_gathered(std::stoll(unit.substr(6)))) return;
  release(u);  // reshard after forward
}

void UnitGatherer::on_grad(std::size_t u, std::size_t k) {
  State& s = units_[u];
  if (!s.flat.defined() || s.got[k]) return;  // a unit backward did not need (an embedding), or counted
  s.got[k] = true;
  if (--s.pending == 0) release(u);
}

}  // namespace remat
