#include "models/block_stack.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "engine/error.h"
#include "engine/rng.h"
#include "engine/recompute_context.h"

namespace remat {

void Block::set_regions(const std::set<std::string>& names) { regions_ = names; }

std::vector<Tensor> Block::Parts::run(const std::string& part, const RegionFn& fn,
                                      const std::vector<Tensor>& inputs) const {
  if (auto h = block_.part_hooks_.find(part); h != block_.part_hooks_.end()) {  // (the plan never also makes it a region)
    std::vector<std::unique_ptr<SavedTensorHooksScope>> scopes;
    for (const auto& hook : h->second) scopes.push_back(std::make_unique<SavedTensorHooksScope>(hook));
    return fn(inputs);
  }
  if (!block_.regions_.count(part)) return fn(inputs);
  CheckpointOptions o;
  o.name = part;
  return checkpoint(fn, inputs, o);
}

std::vector<Tensor> Block::region(const std::string& name, const RegionFn& fn,
                                  const std::vector<Tensor>& inputs) const {
  return parts_.run(name, fn, inputs);
}

Tensor Block::region(const std::string& name, const std::function<Tensor(const Tensor&)>& fn,
                     const Tensor& x) const {
  if (!regions_.count(name) && !part_hooks_.count(name)) return fn(x);
  return region(name, [fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0])}; }, {x})[0];
}

void BlockStack::check_new_block(const std::string& name, const Block* block) const {
  REMAT_CHECK(block != nullptr, Error, "BlockStack::add_block: block '", name, "' is null");
  REMAT_CHECK(!name.empty() && name.find('.') == std::string::npos, Error, "BlockStack::add_block: block name '",
              name, "' must be non-empty and without '.' (it is one part of the parameter names)");
  for (const auto& [n, b] : blocks_)
    REMAT_CHECK(n != name, Error, "BlockStack::add_block: a block named '", name, "' is already in the stack");
  REMAT_CHECK(plan_.is_none(), Error, "BlockStack::add_block: block '", name, "' added after plan '", plan_.spec,
              "' was set; add every block first");
}

const Block& BlockStack::at(std::int64_t i) const {
  REMAT_CHECK(i >= 0 && i < num_blocks(), Error, "BlockStack: block ", i, " does not exist (the stack has ",
              num_blocks(), " blocks)");
  return *blocks_[std::size_t(i)].second;
}

const Block& BlockStack::block(std::int64_t i) const { return at(i); }
Block& BlockStack::block(std::int64_t i) {
  at(i);
  return *blocks_[std::size_t(i)].second;
}

const std::string& BlockStack::block_name(std::int64_t i) const {
  at(i);
  return blocks_[std::size_t(i)].first;
}

std::vector<std::string> BlockStack::sub_regions() const {
  std::vector<std::string> names;
  for (const auto& [n, b] : blocks_)
    for (const auto& r : b->sub_regions())
      if (std::find(names.begin(), names.end(), r) == names.end()) names.push_back(r);
  return names;
}

void BlockStack::set_plan(const std::string& spec) { set_plan(RecomputePlan::parse(spec, num_blocks(), sub_regions())); }

void BlockStack::check_plan(const RecomputePlan& plan) const {
  REMAT_CHECK(!plan.chunked_loss || has_lm_head_, Error, "--recompute ", plan.spec,
              ": chunked_loss needs a model whose blocks are followed by an LM head and cross-entropy that run "
              "it (the decoder's); this stack's model has none (BlockStack::set_has_lm_head)");
  const std::vector<std::string> offered = sub_regions();
  for (const auto& m : plan.modules)
    if (std::find(offered.begin(), offered.end(), m) == offered.end()) {
      // Parsed against another list of names (the decoder's, by default):
      // parsing it for this stack's names names the component and the valid forms.
      RecomputePlan::parse(plan.spec, num_blocks(), offered);
      throw Error("--recompute " + plan.spec + ": sub-region '" + m + "' is offered by no block of this stack");
    }
  for (std::size_t r = 0; r < plan.block_regions.size(); ++r)
    for (auto b : plan.block_regions[r]) {
      REMAT_CHECK(b >= 0 && b < num_blocks(), Error, "--recompute ", plan.spec, ": block ", b,
                  " does not exist (the plan was parsed for more blocks than this stack's ", num_blocks(), ")");
      const std::string side = plan.reentrant_region(r) && !side_ ? at(b).side_outputs() : std::string();
      REMAT_CHECK(side.empty(), Error, "--recompute ", plan.spec, ": block ", b, " ('", block_name(b),
                  "') is in a reentrant region, but its forward hands out ", side,
                  " besides its output, which a reentrant region's backward differentiates only as outputs, and "
                  "this stack has no channel to return them through (BlockStack::set_side_outputs); use the "
                  "non-reentrant form (per_block, chunk, ...) for this block");
    }
}

void BlockStack::set_plan(const RecomputePlan& plan) {
  check_plan(plan);
  std::vector<std::int64_t> region_of(std::size_t(num_blocks()), -1);
  for (std::size_t r = 0; r < plan.block_regions.size(); ++r)
    for (auto b : plan.block_regions[r]) region_of[std::size_t(b)] = std::int64_t(r);
  // Offload and compression: one set of hooks per stack, around the whole
  // forward or handed to the blocks for the named parts (compression
  // innermost, so offload moves the compressed bytes).
  std::shared_ptr<OffloadHooks> offload;
  std::shared_ptr<CompressHooks> compress;
  if (plan.offload) {
    // A later plan with offload reuses the stack's spill file and I/O thread
    // (the file is already grown, the thread running) when the folder is the same.
    if (spare_offload_ && spare_offload_->options().dir == plan.offload_dir) {
      offload = spare_offload_;
    } else {
      OffloadOptions o;
      o.dir = plan.offload_dir;
      const char* sync = std::getenv("REMAT_OFFLOAD_SYNC");  // I/O on the calling thread (checkpoint/offload.h)
      o.synchronous = sync && std::string(sync) == "1";
      offload = std::make_shared<OffloadHooks>(o);
    }
    spare_offload_ = offload;
  }
  if (plan.compress) {
    CompressOptions o;
    o.format = plan.compress_format;
    o.all_saves = plan.compress_all;
    compress = std::make_shared<CompressHooks>(o);
  }
  for (std::int64_t i = 0; i < num_blocks(); ++i) {
    // Outermost first: offload, then compression (innermost).
    std::map<std::string, std::vector<std::shared_ptr<SavedTensorHooks>>> part_hooks;
    if (RecomputePlan::in_range(plan.offload_range, i))
      for (const auto& m : plan.offload_modules) part_hooks[m].push_back(offload);
    if (RecomputePlan::in_range(plan.compress_range, i))
      for (const auto& m : plan.compress_modules) part_hooks[m].push_back(compress);
    Block& b = *blocks_[std::size_t(i)].second;
    b.set_part_hooks(std::move(part_hooks));
    b.set_regions(std::size_t(i) < plan.block_modules.size() ? plan.block_modules[std::size_t(i)] : plan.modules);
  }
  if (!plan.dynamic) {
    dynamic_.reset();
  } else if (!dynamic_ || dynamic_->options().budget != plan.dynamic_budget) {
    DynamicRematOptions o;
    o.budget = plan.dynamic_budget;  // (its device: the first op call's it records)
    const char* frag = std::getenv("REMAT_DYNAMIC_FRAGMENTATION");  // 0: score alone picks (docs/REFERENCE.md)
    o.fragmentation_aware = !(frag && std::string(frag) == "0");
    dynamic_ = std::make_shared<DynamicRemat>(o);
  }
  plan_ = plan;
  offload_ = offload;
  compress_ = compress;
  offload_whole_ = plan.offload && plan.offload_modules.empty() && !plan.offload_range;
  compress_whole_ = plan.compress && plan.compress_modules.empty() && !plan.compress_range;
  region_of_ = std::move(region_of);
}

namespace {
thread_local std::vector<const BlockStack*> tls_open_stacks;  // stacks whose save hooks are active
}  // namespace

UnitRun::UnitRun(UnitRunHooks* hooks, std::string unit) : hooks_(hooks), unit_(std::move(unit)) {
  if (hooks_) hooks_->before_run(unit_);
}

Tensor UnitRun::done(Tensor y) {
  if (hooks_) hooks_->after_run(unit_, y);
  return y;
}

BlockStack::SaveHooksScope::SaveHooksScope(const BlockStack& stack) {
  const std::shared_ptr<SavedTensorHooks> unit_saves = stack.unit_hooks_ ? stack.unit_hooks_->save_hooks() : nullptr;
  if (!stack.offload_whole_ && !stack.compress_whole_ && !unit_saves) return;
  if (std::find(tls_open_stacks.begin(), tls_open_stacks.end(), &stack) != tls_open_stacks.end()) return;
  stack_ = &stack;
  tls_open_stacks.push_back(&stack);
  if (unit_saves) scopes_.push_back(std::make_unique<SavedTensorHooksScope>(unit_saves));  // outermost
  if (stack.offload_whole_) scopes_.push_back(std::make_unique<SavedTensorHooksScope>(stack.offload_));
  if (stack.compress_whole_) scopes_.push_back(std::make_unique<SavedTensorHooksScope>(stack.compress_));
}

BlockStack::SaveHooksScope::~SaveHooksScope() {
  if (!stack_) return;
  while (!scopes_.empty()) scopes_.pop_back();  // innermost first
  tls_open_stacks.erase(std::find(tls_open_stacks.begin(), tls_open_stacks.end(), stack_));
}

Tensor BlockStack::run_block(std::int64_t i, const Tensor& x) const {
  enter_rng_stream(i);  // keyed draws inside an RngStreamScope (its recompute draws the same)
  const bool watch = observer_ && !in_recompute();
  if (watch) observer_->before_block(i, x);
  UnitRun unit(unit_hooks_.get(), "block." + std::to_string(i));
  Tensor y = unit.done(blocks_[std::size_t(i)].second->forward(x));
  if (watch) observer_->after_block(i, y);
  return y;
}

Tensor BlockStack::forward(const Tensor& x) const { return forward(x, 0, num_blocks()); }

Tensor BlockStack::forward(const Tensor& x, std::int64_t begin, std::int64_t end) const {
  REMAT_CHECK(0 <= begin && begin <= end && end <= num_blocks(), Error, "BlockStack::forward: blocks [", begin, ", ",
              end, ") are not a range of the stack's ", num_blocks());
  for (const auto& group : plan_.block_regions)
    REMAT_CHECK(group.back() < begin || group.front() >= end || (group.front() >= begin && group.back() < end), Error,
                "BlockStack::forward: the plan's region over blocks ", group.front(), "-", group.back(),
                " crosses the range [", begin, ", ", end, ") (a pipeline stage boundary); use per-block regions or "
                "groups inside each stage");
  SaveHooksScope save_hooks(*this);
  // A ranged offload / compression (offload@A-B): its hooks while block i
  // runs (with the region it starts, whose boundary it packs).
  auto ranged_hooks = [this](std::int64_t i) {
    std::vector<std::unique_ptr<SavedTensorHooksScope>> scopes;
    if (offload_ && plan_.offload_range && plan_.offload_modules.empty() && RecomputePlan::in_range(plan_.offload_range, i))
      scopes.push_back(std::make_unique<SavedTensorHooksScope>(offload_));
    if (compress_ && plan_.compress_range && plan_.compress_modules.empty() &&
        RecomputePlan::in_range(plan_.compress_range, i))
      scopes.push_back(std::make_unique<SavedTensorHooksScope>(compress_));
    return scopes;
  };
  Tensor h = x;
  if (plan_.block_regions.empty()) {
    for (std::int64_t i = begin; i < end; ++i) {
      const auto hooks = ranged_hooks(i);
      h = run_block(i, h);
    }
    return h;
  }
  // Block-level regions, in block order; blocks outside any region run plainly.
  for (std::int64_t i = begin; i < end;) {
    const auto hooks = ranged_hooks(i);
    const std::int64_t r = region_of_[std::size_t(i)];
    if (r < 0) {
      h = run_block(i, h);
      ++i;
      continue;
    }
    const auto& group = plan_.block_regions[std::size_t(r)];
    h = run_region(std::size_t(r), group, h);
    i = group.back() + 1;
  }
  return h;
}

Tensor BlockStack::run_region(std::size_t r, const std::vector<std::int64_t>& group, const Tensor& h) const {
  CheckpointOptions o;
  o.name = group.size() == 1 ? "block " + std::to_string(group[0])
                             : "blocks " + std::to_string(group.front()) + "-" + std::to_string(group.back());
  o.policy = r < plan_.region_policies.size() ? plan_.region_policies[r] : plan_.policy;
  o.reentrant = plan_.reentrant_region(r);  // (parse() gives it no policy)
  const bool side = o.reentrant && side_ && std::any_of(group.begin(), group.end(), [this](std::int64_t b) {
                      return !at(b).side_outputs().empty();
                    });
  if (!side)
    return checkpoint([this, group](const Tensor& t) {
      Tensor u = t;
      for (auto b : group) u = run_block(b, u);
      return u;
    }, h, o);
  // The blocks' side outputs leave as the region's outputs 1.. (its replays
  // return them again; only the first run's metrics are kept).
  auto kept = std::make_shared<std::any>();
  auto first = std::make_shared<bool>(true);
  std::vector<Tensor> outs = checkpoint(
      [this, group, channel = side_, kept, first](const std::vector<Tensor>& in) {
        Tensor u = in[0];
        std::vector<Tensor> out = channel->capture([&] {
          for (auto b : group) u = run_block(b, u);
        }, std::exchange(*first, false) ? kept.get() : nullptr);
        out.insert(out.begin(), u);
        return out;
      },
      {h}, o);
  side_->emit(std::vector<Tensor>(outs.begin() + 1, outs.end()), std::move(*kept));
  return outs[0];
}

}  // namespace remat
