#include "train/zero.h"

#include <cstdlib>

#include "engine/allocator.h"
#include "engine/grad_mode.h"

namespace remat {

std::string shard_unit_name(const std::string& name) {
  static const std::string layers = "model.layers.", embed = "model.embed_tokens.";
  if (name.compare(0, embed.size(), embed) == 0) return "embed";
  if (name.compare(0, layers.size(), layers) == 0) {
    const std::size_t dot = name.find('.', layers.size());
    return "block." + name.substr(layers.size(), dot == std::string::npos ? std::string::npos : dot - layers.size());
  }
  return "head";
}

bool zero_shards_parameter(std::int64_t ep, const std::string& name) { return !(ep > 1 && is_expert_parameter(name)); }

void check_zero_stage(std::int64_t stage) {
  REMAT_CHECK(stage >= 0 && stage <= 3, Error, "--zero ", stage, ": expected 1 (shard the optimizer state), "
              "2 (and the gradients) or 3 (and the parameters), or 0 for none");
}

ZeroOptimizer::ZeroOptimizer(int stage, const std::vector<std::pair<std::string, Tensor>>& params,
                             std::shared_ptr<ProcessGroup> group,
                             const std::function<bool(const std::string&)>& sharded,
                             const std::function<bool(const std::string&)>& ready_may_differ, AdamWOptions opts,
                             const ParameterRangeSource& initial)
    : stage_(stage), group_(std::move(group)), all_params_(params) {
  check_zero_stage(stage);
  REMAT_CHECK(!initial || stage == 3, Error, "ZeroOptimizer: initial values by range are for stage 3 (got stage ",
              stage, ")");
  REMAT_CHECK(stage >= 1 && group_ && group_->size() > 1, Error, "--zero ", stage,
              ": shards over data-parallel ranks, but this run has ", group_ ? group_->size() : 0,
              " (start it under `mpirun -np D` with D >= 2)");
  // Units in the order their parameters first appear (the model's order).
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::pair<std::string, Tensor>>> members;
  std::map<std::string, bool> deferred;
  for (const auto& [name, p] : params) {
    if (!sharded(name)) {
      unsharded_.push_back(p);
      unsharded_names_.push_back(name);
      continue;
    }
    const std::string u = shard_unit_name(name);
    if (!members.count(u)) order.push_back(u);
    members[u].emplace_back(name, p);
    deferred[u] = deferred[u] || ready_may_differ(name);
  }
  const int W = group_->size(), rank = group_->rank();
  std::vector<ShardedUnit> reduced;
  NoGradGuard ng;
  for (const std::string& name : order) {
    Unit u;
    std::vector<std::string> names;
    std::vector<Shape> shapes;
    for (const auto& [n, p] : members[name]) {
      names.push_back(n);
      shapes.push_back(p.sizes());
      u.params.push_back(p);
    }
    u.layout = make_shard_layout(name, std::move(names), std::move(shapes), W);
    u.pieces = u.layout.pieces(rank);
    Tensor master;
    if (stage_ == 3) {  // this rank's shard of the values, which AdamW updates
      master = make_master(u, rank, initial);
      masters_.push_back(master);
    }
    for (const ShardPiece& pc : u.pieces) {
      const Tensor& p = u.params[pc.member];
      REMAT_CHECK(p.is_contiguous() && p.dtype() == DType::f32, DTypeError, "--zero: parameter '",
                  u.layout.names[pc.member], "' must be contiguous f32, got ", p.dtype());
      u.views.push_back(stage_ == 3 ? master.narrow(0, pc.shard_begin, pc.n) : p.view({-1}).narrow(0, pc.param_begin, pc.n));
    }
    if (stage_ >= 2) reduced.push_back(ShardedUnit{u.layout, u.params, deferred[name]});
    units_.push_back(std::move(u));
  }
  if (stage_ >= 2) reducer_ = std::make_unique<ShardedGradReducer>(std::move(reduced), group_);
  if (stage_ == 3) {
    // The parameters let their values go (the gatherer releases them); a
    // unit's backward ends when its members whose readiness is the same on
    // every rank have their gradients.
    std::vector<UnitGatherer::Unit> gathered;
    for (std::size_t k = 0; k < units_.size(); ++k) {
      std::vector<bool> counted;
      for (const std::string& n : units_[k].layout.names) counted.push_back(!ready_may_differ(n));
      gathered.push_back(UnitGatherer::Unit{units_[k].layout, units_[k].params, masters_[k], counted});
    }
    gatherer_ = std::make_shared<UnitGatherer>(std::move(gathered), group_);
    gatherer_->install();
  }
  if (initial) fill_unsharded(initial);
  make_adamw(opts);
}

void ZeroOptimizer::make_adamw(AdamWOptions opts) {
  std::vector<AdamWParam> slots;
  for (const Unit& u : units_) {
    // AdamW's moments for the unit's pieces: views into one buffer each of
    // the shard's size, so every rank allocates the same blocks (pieces
    // straddle members differently on each rank).
    CategoryScope cat(MemoryCategory::optimizer);
    const TensorOptions state(DType::f32, u.params.front().device());
    const Tensor m = zeros({u.layout.shard}, state), v = zeros({u.layout.shard}, state);
    for (std::size_t i = 0; i < u.pieces.size(); ++i) {
      const ShardPiece& pc = u.pieces[i];
      slots.push_back(AdamWParam{piece_name(u, pc), u.views[i], u.layout.shapes[pc.member].size() >= 2,
                                 m.narrow(0, pc.shard_begin, pc.n), v.narrow(0, pc.shard_begin, pc.n)});
    }
  }
  for (std::size_t i = 0; i < unsharded_.size(); ++i)
    slots.push_back(AdamWParam{unsharded_names_[i], unsharded_[i], unsharded_[i].dim() >= 2});
  adamw_ = std::make_unique<AdamW>(std::move(slots), opts);
}

Tensor ZeroOptimizer::make_master(const Unit& u, int rank, const ParameterRangeSource& initial) const {
  CategoryScope cat(MemoryCategory::parameter);
  NoGradGuard ng;
  Tensor master = empty({u.layout.shard}, TensorOptions(DType::f32, u.params.front().device()));
  if (!initial) {
    pack_shard(u.layout, rank, u.params, master);
    return master;
  }
  fill_master(u, master, initial);
  return master;
}

void ZeroOptimizer::fill_master(const Unit& u, Tensor& master, const ParameterRangeSource& values) const {
  NoGradGuard ng;
  master.zero_();  // (the padding)
  for (const ShardPiece& pc : u.pieces) {
    Tensor dst = master.narrow(0, pc.shard_begin, pc.n);
    values(u.layout.names[pc.member], pc.param_begin, dst);
  }
  master.bump_version();
}

void ZeroOptimizer::fill_unsharded(const ParameterRangeSource& initial) {
  CategoryScope cat(MemoryCategory::parameter);
  NoGradGuard ng;
  for (std::size_t i = 0; i < unsharded_.size(); ++i) {
    Tensor v = empty(unsharded_[i].sizes(), TensorOptions(DType::f32, unsharded_[i].device()));
    Tensor flat = v.view({-1});
    initial(unsharded_names_[i], 0, flat);
    unsharded_[i].alias_storage_(v);
  }
}

std::string ZeroOptimizer::piece_name(const Unit& u, const ShardPiece& p) const {
  return u.layout.names[p.member] + "@" + std::to_string(p.param_begin);
}

const std::vector<Tensor>& ZeroOptimizer::bind_grads() {
  NoGradGuard ng;
  bound_.clear();
  for (std::size_t k = 0; k < units_.size(); ++k) {
    const Unit& u = units_[k];
    for (std::size_t i = 0; i < u.pieces.size(); ++i) {
      const ShardPiece& pc = u.pieces[i];
      Tensor g;
      if (stage_ >= 2) {
        g = reducer_->shard(k).narrow(0, pc.shard_begin, pc.n);
      } else {
        const Tensor whole = u.params[pc.member].grad();
        REMAT_CHECK(whole.defined() && whole.is_contiguous() && whole.dtype() == DType::f32, Error,
                    "--zero 1: parameter '", u.layout.names[pc.member],
                    "' has no contiguous f32 gradient after the reduction");
        g = whole.view({-1}).narrow(0, pc.param_begin, pc.n);
      }
      u.views[i].set_grad(g);
      bound_.push_back(u.views[i]);
    }
  }
  for (const Tensor& p : unsharded_) bound_.push_back(p);
  return bound_;
}

std::vector<Tensor> ZeroOptimizer::shard_pieces() const {
  std::vector<Tensor> out;
  for (const Unit& u : units_) out.insert(out.end(), u.views.begin(), u.views.end());
  return out;
}

std::vector<std::string> ZeroOptimizer::shard_piece_parameters() const {
  std::vector<std::string> out;
  for (const Unit& u : units_)
    for (const auto& piece : u.pieces) out.push_back(u.layout.names[piece.member]);
  return out;
}

void ZeroOptimizer::step(double lr) {
  if (gatherer_) gatherer_->release_all();  // (after backward nothing is gathered; values change now)
  adamw_->step(lr);
  NoGradGuard ng;
  if (stage_ == 3) {
    for (const Unit& u : units_)
      for (const Tensor& p : u.params) p.bump_version();
    return;
  }
  const int rank = group_->rank();
  for (Unit& u : units_) {
    CategoryScope cat(MemoryCategory::parameter);
    Tensor shard = empty({u.layout.shard}, TensorOptions(DType::f32, u.params.front().device()));
    pack_shard(u.layout, rank, u.params, shard);
    const Tensor flat = group_->all_gather(shard);
    unpack_flat(u.layout, flat, u.params);
  }
}

std::vector<std::pair<std::string, Tensor>> ZeroOptimizer::parameter_values() const {
  if (stage_ != 3) return all_params_;
  std::map<std::string, Tensor> gathered;
  NoGradGuard ng;
  for (std::size_t k = 0; k < units_.size(); ++k) {
    const ShardLayout& l = units_[k].layout;
    const Tensor flat = group_->all_gather(masters_[k]);
    for (std::size_t m = 0; m < l.names.size(); ++m)
      gathered[l.names[m]] = member_view(l, flat, m).clone();
  }
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, p] : all_params_) {
    auto it = gathered.find(name);
    out.emplace_back(name, it == gathered.end() ? p : it->second);
  }
  return out;
}

void ZeroOptimizer::load_parameters(const ParameterRangeSource& values) {
  if (stage_ != 3) return;
  for (std::size_t k = 0; k < units_.size(); ++k) fill_master(units_[k], masters_[k], values);
  if (gatherer_) gatherer_->release_all();
}

std::vector<std::pair<std::string, Tensor>> ZeroOptimizer::one_process_state() const {
  std::map<std::string, Tensor> mine;
  for (auto& [name, t] : adamw_->state()) mine.emplace(name, t);
  std::vector<std::pair<std::string, Tensor>> out;
  NoGradGuard ng;
  for (const Unit& u : units_) {
    for (const char* kind : {"optimizer.exp_avg.", "optimizer.exp_avg_sq."}) {
      // This rank's pieces of the state, laid out as its shard, then every rank's.
      Tensor shard = zeros({u.layout.shard}, TensorOptions(DType::f32, u.params.front().device()));
      for (const ShardPiece& pc : u.pieces)
        shard.narrow(0, pc.shard_begin, pc.n).copy_(mine.at(kind + piece_name(u, pc)));
      const Tensor flat = group_->all_gather(shard);
      for (std::size_t k = 0; k < u.params.size(); ++k)
        out.emplace_back(kind + u.layout.names[k],
                         member_view(u.layout, flat, k).clone());
    }
  }
  for (const std::string& name : unsharded_names_)
    for (const char* kind : {"optimizer.exp_avg.", "optimizer.exp_avg_sq."}) out.emplace_back(kind + name, mine.at(kind + name));
  return out;
}

std::vector<std::pair<std::string, Tensor>> ZeroOptimizer::shard_pieces_named() const {
  std::map<std::string, Tensor> state;
  for (auto& [name, t] : adamw_->state()) state.emplace(name, t);
  std::vector<std::pair<std::string, Tensor>> out;
  for (const Unit& u : units_)
    for (std::size_t i = 0; i < u.pieces.size(); ++i) {
      const std::string at = "@" + std::to_string(u.pieces[i].param_begin);
      const std::string& name = u.layout.names[u.pieces[i].member];
      out.emplace_back(name + at, u.views[i]);
      for (const char* kind : {"optimizer.exp_avg.", "optimizer.exp_avg_sq."})
        out.emplace_back(kind + name + at, state.at(kind + piece_name(u, u.pieces[i])));
    }
  return out;
}

std::vector<std::pair<std::string, Tensor>> ZeroOptimizer::unsharded_named() const {
  std::map<std::string, Tensor> state;
  for (auto& [name, t] : adamw_->state()) state.emplace(name, t);
  std::vector<std::pair<std::string, Tensor>> out;
  for (std::size_t i = 0; i < unsharded_.size(); ++i) out.emplace_back(unsharded_names_[i], unsharded_[i]);
  for (const std::string& name : unsharded_names_)
    for (const char* kind : {"optimizer.exp_avg.", "optimizer.exp_avg_sq."}) out.emplace_back(kind + name, state.at(kind + name));
  return out;
}

void ZeroOptimizer::load_state(const ParameterRangeSource& values, std::int64_t step) {
  // AdamW's slot -> the one-process tensor and the first element it starts at.
  std::map<std::string, std::pair<std::string, std::int64_t>> source;
  for (const Unit& u : units_)
    for (const ShardPiece& pc : u.pieces) source[piece_name(u, pc)] = {u.layout.names[pc.member], pc.param_begin};
  for (const std::string& name : unsharded_names_) source[name] = {name, 0};
  adamw_->fill_state(
      [&](const std::string& prefix, const std::string& slot, Tensor& dst) {
        const auto& [name, begin] = source.at(slot);
        Tensor flat = dst.view({-1});
        values(prefix + name, begin, flat);
      },
      step);
}

std::vector<ZeroOptimizer::StateRange> ZeroOptimizer::loaded_ranges() const {
  std::vector<StateRange> out;
  for (const Unit& u : units_)
    for (const ShardPiece& pc : u.pieces) {
      const std::string& name = u.layout.names[pc.member];
      if (stage_ == 3) out.push_back({name, pc.param_begin, pc.n});
      for (const char* prefix : {"optimizer.exp_avg.", "optimizer.exp_avg_sq."})
        out.push_back({prefix + name, pc.param_begin, pc.n});
    }
  for (std::size_t i = 0; i < unsharded_.size(); ++i)
    for (const char* prefix : {"optimizer.exp_avg.", "optimizer.exp_avg_sq."})
      out.push_back({prefix + unsharded_names_[i], 0, unsharded_[i].numel()});
  return out;
}

std::int64_t ZeroOptimizer::held_parameters() const {
  std::int64_t n = 0;
  if (stage_ != 3) {
    for (const auto& [name, p] : all_params_) n += p.numel();
    return n;
  }
  for (const Tensor& m : masters_) n += m.numel();
  for (const Tensor& p : unsharded_) n += p.numel();
  return n;
}

std::int64_t ZeroOptimizer::persistent_bytes() const {
  std::int64_t n = 0;
  if (stage_ == 3) {  // this rank's shards of the weights, and the unsharded ones whole
    for (const Tensor& m : masters_) n += std::int64_t(m.nbytes());
    for (const Tensor& p : unsharded_) n += std::int64_t(p.nbytes());
  } else {
    for (const auto& [name, p] : all_params_) n += std::int64_t(p.nbytes());  // the weights, whole
  }
  if (stage_ >= 2) {
    for (std::size_t u = 0; u < reducer_->num_units(); ++u) n += std::int64_t(reducer_->shard(u).nbytes());
    for (const Tensor& p : unsharded_) n += std::int64_t(p.nbytes());
  } else {
    for (const auto& [name, p] : all_params_) n += std::int64_t(p.nbytes());  // whole gradients
  }
  for (const auto& [name, t] : adamw_->state()) n += std::int64_t(t.nbytes());
  return n;
}

namespace {
std::vector<Tensor> tensors_of(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<Tensor> v;
  for (const auto& [name, t] : named) v.push_back(t);
  return v;
}
}  // namespace

DataParallelUpdate make_data_parallel_update(const ParallelLayout& layout,
                                             const std::vector<std::pair<std::string, Tensor>>& params,
                                             std::int64_t bucket_bytes, std::int64_t zero, AdamWOptions opts,
                                             DecoderModel& model, const ParameterRangeSource& initial) {
  BlockStack& stack = *model.model->blocks;
  DataParallelUpdate u;
  if (zero == 0) {
    REMAT_CHECK(!stack.plan().keep_gathered, Error, "--recompute ", stack.plan().spec,
                ": keep_gathered keeps blocks' gathered parameters, which only --zero 3 gathers");
    u.reducer = make_grad_reducer(layout, params, bucket_bytes);
    u.adamw = std::make_unique<AdamW>(params, opts);
    give_gradient_buffers(tensors_of(params));
    return u;
  }
  const std::int64_t ep = layout.ep;
  auto sharded = [ep](const std::string& name) { return zero_shards_parameter(ep, name); };
  std::vector<std::pair<std::string, Tensor>> whole;
  for (const auto& [name, p] : params)
    if (zero == 1 || !sharded(name)) whole.emplace_back(name, p);
  if (!whole.empty()) u.reducer = make_grad_reducer(layout, whole, bucket_bytes);
  give_gradient_buffers(tensors_of(whole));  // (the sharded ones' gradients are the reducer's)
  u.zero = std::make_unique<ZeroOptimizer>(int(zero), params, layout.grad_group ? layout.grad_group : layout.world,
                                           sharded, is_expert_parameter, opts, initial);
  if (u.zero->gatherer()) {
    u.zero->set_gather_precision(gather_precision(model));
    stack.set_unit_hooks(u.zero->gatherer());
    u.zero->gatherer()->follow_plan(&stack);  // keep_gathered
  }
  REMAT_CHECK(zero == 3 || !stack.plan().keep_gathered, Error, "--recompute ", stack.plan().spec,
              ": keep_gathered keeps blocks' gathered parameters, which only --zero 3 gathers");
  return u;
}

}  // namespace remat

namespace remat {

void DataParallelUpdate::zero_shards() {
  if (zero && zero->grad_reducer()) zero->grad_reducer()->zero();
}

void DataParallelUpdate::backward(const Tensor& loss, double seed_scale) {
  ShardedGradReducer* sharded = zero ? zero->grad_reducer() : nullptr;
  if (reducer) reducer->prepare();
  if (sharded) sharded->prepare();
  loss.backward(seed_scale != 1.0 ? full({}, seed_scale, TensorOptions(loss.dtype(), loss.device())) : Tensor());
  if (reducer) reducer->finish();
  if (sharded) sharded->finish();
  if (zero && zero->gatherer()) zero->gatherer()->release_all();
}

void DataParallelUpdate::step(const std::vector<Tensor>& params, double clip, double lr) {
  if (zero) {
    clip_grad_norm(zero->bind_grads(), clip);
    zero->step(lr);
  } else {
    clip_grad_norm(params, clip);
    adamw->step(lr);
  }
}

std::int64_t ZeroOptimizer::working_bytes() const {
  if (stage_ < 2) return 0;
  auto gradient = [&](std::size_t k) { return units_[k].layout.padded() * std::int64_t(sizeof(float)); };
  std::int64_t most = 0;
  for (std::size_t k = 0; k < units_.size(); ++k) {
    if (!gatherer_) {
      most = std::max(most, gradient(k));
      continue;
    }
    // Unit k's backward: it gathered, the unit before it prefetched (not the
    // embedding, whose backward needs no weight), its flat gradient; its
    // forward: it and the next unit gathered.
    const bool before = k >= 1 && units_[k - 1].layout.name != "embed";
    most = std::max(most, gatherer_->gathered_bytes(k) + (before ? gatherer_->gathered_bytes(k - 1) : 0) + gradient(k));
    if (k + 1 < units_.size()) most = std::max(most, gatherer_->gathered_bytes(k) + gatherer_->gathered_bytes(k + 1));
  }
  return most;
}

void ZeroOptimizer::set_gather_precision(const GatherPrecision& precision) {
  if (!gatherer_) return;
  for (std::size_t k = 0; k < units_.size(); ++k) {
    bool lowp = precision.compute != DType::f32;
    for (const std::string& n : units_[k].layout.names) lowp = lowp && !precision.f32_reads.count(n);
    gatherer_->set_dtype(k, lowp ? precision.compute : DType::f32);
  }
}

GatherPrecision gather_precision(const DecoderModel& model) {
  return GatherPrecision{model.compute_dtype(), model.f32_read_parameters()};
}

std::int64_t DataParallelUpdate::persistent_bytes(const std::vector<std::pair<std::string, Tensor>>& params) const {
  return zero ? zero->persistent_bytes() : remat::persistent_bytes(params, *adamw);
}

}  // namespace remat
