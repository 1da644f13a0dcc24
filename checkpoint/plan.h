// Model-level recompute plans: the `--recompute` values of
// docs/RECOMPUTE.md#plans, parsed and checked here; models/block_stack.h
// applies them to a stack of blocks (the decoder's, or a user model's).
//
//   none                 no regions
//   per_block            every block is a region (keeps each block's input)
//   chunk                the whole block stack is one region
//   selected:I,J,...     the named blocks are regions
//   uniform:N            consecutive groups of N blocks are regions
//   block:N              the first N blocks are regions
//   C:reentrant          C one of per_block, chunk, selected:I,J,...,
//                        uniform:N, block:N (before any @range:
//                        per_block:reentrant@0-3): the same regions,
//                        reentrant (checkpoint/checkpoint.h): each records
//                        one node whose backward replays the whole region
//                        and differentiates it on its own (no early stop, no
//                        op policy, no block with side outputs such as an
//                        MoE block: models/block_stack.h; backward() only,
//                        not grad())
//   attention            the attention half of every block is a region
//   moe_expert           routed-expert compute + unpermute of every MoE block
//   selective:NAMES      module regions (core_attn, layernorm, mlp, moe_act,
//                        moe, shared_experts, or the sub-regions a user's
//                        blocks offer) in every block, or per-block
//                        regions with an op policy (save_matmul,
//                        save_attention, save_ops=op1/op2/... where each op
//                        is one of replay_cacheable_ops(): matmul,
//                        scaled_dot_product_attention)
//   offload[:NAMES]      saved tensors go to a spill file after the forward and
//                        come back before backward (exact); with block-level
//                        regions, that is their boundaries; NAMES limits it to
//                        those sub-regions (checkpoint/offload.h)
//   compress:FMT[:NAMES] saved matmul inputs and region boundaries kept as FMT
//                        (bf16 or fp8, MXFP8) and expanded on unpack (lossy;
//                        checkpoint/compress.h); compress:FMT:all takes every
//                        floating save
//   C@A-B                any component but selected:, block: and keep_last,
//                        limited to blocks A..B (or @A: one block), e.g.
//                        per_block@0-3+selective:save_matmul@4-7+offload@0-1
//   chunked_loss[:N]     the LM head and its cross-entropy N tokens at a time
//                        (ops/linear_cross_entropy.h): the logits are never
//                        whole, each chunk's gradients made with them in the
//                        forward; N omitted: the model's default from its
//                        vocabulary (models/decoder.h). Needs a model with an
//                        LM head.
//   dynamic[:BYTES]      dynamic rematerialization (checkpoint/dynamic_remat.h):
//                        saves are evicted when an allocation would take
//                        the device's allocated bytes above BYTES and
//                        computed again when backward needs them. The
//                        commands resolve `dynamic` with --memory-budget B
//                        to dynamic:BYTES. Combines with every other
//                        component (per_block+dynamic: dynamic manages
//                        what the regions keep).
//   keep_last            (with block-level regions) the last block leaves its
//                        region and keeps its saves: its backward starts right
//                        after the forward, so its replay is redone work. Costs
//                        one block's saves during the head's forward and
//                        backward (free when the head is small next to a block).
//
// Components combine with '+' where they do not overlap.
//
// Sub-region names: parse() takes the names the blocks offer (default: the
// decoder's, builtin_sub_regions()). "attention" and "moe_expert" are
// components on their own; every other name is used as selective:NAME. The
// decoder's names overlap as its layout nests them (attention covers the
// input layernorm and core_attn, mlp covers the MoE parts, ...); any other
// name covers only itself.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/compress.h"
#include "checkpoint/policy.h"

namespace remat {

struct RecomputePlan {
  std::string spec = "none";
  std::int64_t n_layers = 0;  // the blocks it was parsed for
  // Block-level regions: groups of consecutive block indices, each one region,
  // with the op policy of each (null: recompute everything) and its name,
  // and whether it is reentrant (C:reentrant; never with a policy).
  std::vector<std::vector<std::int64_t>> block_regions;
  std::vector<Policy> region_policies;
  std::vector<std::string> region_policy_names;
  std::vector<bool> region_reentrant;
  // The module regions of each block (`modules` is their union).
  std::vector<std::set<std::string>> block_modules;
  // Sub-block module regions applied in every block (names from the list
  // parse() was given: by default "attention", "core_attn", "layernorm",
  // "mlp", "moe_act", "moe", "shared_experts", "moe_expert").
  std::set<std::string> modules;
  // The (last) op policy named (selective:save_*), or null; each region
  // carries its own in region_policies.
  Policy policy;
  std::string policy_name;

  // Offload and compression of saved tensors (checkpoint/offload.h,
  // checkpoint/compress.h): around the whole model's forward when the module
  // set is empty, else only around those sub-regions.
  bool offload = false;
  std::set<std::string> offload_modules;
  bool compress = false;
  CompressFormat compress_format = CompressFormat::fp8;
  std::set<std::string> compress_modules;
  bool compress_all = false;  // compress:FMT:all: every floating save, not only matmul inputs and boundaries
  // Limited by @A-B to the blocks A..B (their forward, regions and the
  // named parts in them); unset: the whole model (embedding, blocks, head).
  std::optional<std::pair<std::int64_t, std::int64_t>> offload_range, compress_range;
  // Where offload's spill file goes (empty: the temp folder); set by the
  // caller (--offload-dir), not by the plan string.
  std::string offload_dir;
  // chunked_loss[:N]: the head and loss in chunks of loss_chunk tokens (0:
  // the model's default).
  bool chunked_loss = false;
  std::int64_t loss_chunk = 0;
  // keep_gathered[@A-B] (--zero 3, train/zero_gather.h): those blocks keep
  // their gathered parameters from their forward to their backward (one
  // gather a step instead of two, their parameters held meanwhile); unset
  // range: every block.
  bool keep_gathered = false;
  std::optional<std::pair<std::int64_t, std::int64_t>> keep_gathered_range;
  bool keeps_gathered(std::int64_t block) const { return keep_gathered && in_range(keep_gathered_range, block); }

  // dynamic[:BYTES]: dynamic rematerialization under a budget of
  // dynamic_budget allocated bytes (0: not resolved yet, the commands take
  // it from --memory-budget).
  bool dynamic = false;
  std::int64_t dynamic_budget = 0;
  bool is_none() const {
    return block_regions.empty() && modules.empty() && !offload && !compress && !chunked_loss && !keep_gathered &&
           !dynamic;
  }
  // True if block `i` is inside a block-level region.
  bool block_in_region(std::int64_t i) const;
  // True if block-level region `r` is reentrant (false past region_reentrant's
  // end: a plan built without it).
  bool reentrant_region(std::size_t r) const { return r < region_reentrant.size() && region_reentrant[r]; }
  // True if the hooks of a ranged (or whole-model) offload / compression
  // apply to block i.
  static bool in_range(const std::optional<std::pair<std::int64_t, std::int64_t>>& r, std::int64_t i) {
    return !r || (i >= r->first && i <= r->second);
  }

  // The plan as a canonical string that parse() turns back into an equal
  // plan (block ranges written as @A-B, reentrant regions as C:reentrant;
  // keep_last already applied).
  std::string str() const;
  // Same regions (reentrant or not), policies, module regions, offload and
  // compression (the spec text and offload_dir aside).
  bool operator==(const RecomputePlan& o) const;

  // The decoder's sub-region names, in the order error messages list them.
  static const std::vector<std::string>& builtin_sub_regions();

  // Parses `spec` for a model of `n_layers` blocks whose blocks offer the
  // sub-regions `sub_regions` (each non-empty, letters, digits and '_', not
  // starting with "save_", not "all" nor "reentrant"). Throws Error naming
  // the bad component and why
  // (unknown name, out-of-range block, overlapping components), listing the
  // valid forms with these names.
  static RecomputePlan parse(const std::string& spec, std::int64_t n_layers,
                             const std::vector<std::string>& sub_regions = builtin_sub_regions());
};

}  // namespace remat
