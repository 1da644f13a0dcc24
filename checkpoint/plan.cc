#include "checkpoint/plan.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <sstream>
#include <tuple>

#include "engine/error.h"

namespace remat {

namespace {

// "attention" and "moe_expert" are plan components on their own; every other
// sub-region name is named under selective:.
bool standalone(const std::string& name) { return name == "attention" || name == "moe_expert"; }

std::string valid_forms(const std::vector<std::string>& sub_regions) {
  std::string own, selective;
  for (const auto& n : sub_regions) (standalone(n) ? own : selective) += n + ", ";
  return "valid plans: none, per_block, chunk, selected:I,J,..., uniform:N, block:N, " + own +
         "keep_last (with block regions), offload, offload:NAMES, compress:bf16|fp8, compress:bf16|fp8:NAMES|all, "
         "chunked_loss, chunked_loss:N (tokens per chunk), keep_gathered (with --zero 3), "
         "dynamic, dynamic:BYTES (with --memory-budget, or the budget in bytes), "
         "selective:NAMES (" + selective + "save_matmul, "
         "save_attention, save_ops=OP/OP/... with OP one of " +
         replay_cacheable_list() + "), combined with '+' where they do not overlap; per_block, chunk, selected:, "
         "uniform:N and block:N also as reentrant regions with :reentrant before any @range "
         "(per_block:reentrant, uniform:2:reentrant@0-3)";
}

// Errors name the plan and the reason, then list the valid forms.
struct Bad {
  const std::string& spec;
  const std::vector<std::string>& sub_regions;
  [[noreturn]] void operator()(const std::string& why) const {
    throw Error("--recompute " + spec + ": " + why + "; " + valid_forms(sub_regions));
  }
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.push_back("");
  return out;
}

std::int64_t parse_int(const Bad& bad, const std::string& what, const std::string& s) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
    bad(what + " expects a non-negative integer, got '" + s + "'");
  std::int64_t v = 0;  // from_chars: no exception for a number past int64 (std::stoll throws one)
  if (std::from_chars(s.data(), s.data() + s.size(), v).ec != std::errc())
    bad(what + " value '" + s + "' is too large");
  return v;
}

// Which sub-block parts each module region covers, for the overlap check:
// the decoder's layout for its names, the name itself for any other.
std::set<std::string> parts_of(const std::string& module) {
  if (module == "attention") return {"input_layernorm", "core_attn", "attn_proj"};
  if (module == "layernorm") return {"input_layernorm", "post_attention_layernorm"};
  if (module == "core_attn") return {"core_attn"};
  if (module == "mlp") return {"mlp", "moe_act", "moe_experts", "shared_experts", "router"};
  if (module == "moe") return {"moe_act", "moe_experts", "shared_experts", "router"};
  if (module == "moe_expert") return {"moe_act", "moe_experts"};
  if (module == "moe_act") return {"moe_act"};
  if (module == "shared_experts") return {"shared_experts"};
  return {module};
}

}  // namespace

bool RecomputePlan::block_in_region(std::int64_t i) const {
  for (const auto& r : block_regions)
    if (std::find(r.begin(), r.end(), i) != r.end()) return true;
  return false;
}

namespace {

std::string range_str(std::int64_t lo, std::int64_t hi, std::int64_t n) {
  if (lo == 0 && hi == n - 1) return "";
  return "@" + std::to_string(lo) + (hi == lo ? "" : "-" + std::to_string(hi));
}

std::string join(const std::set<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ",") + n;
  return out;
}

}  // namespace

std::string RecomputePlan::str() const {
  std::vector<std::string> parts;
  // Block-level regions, in block order: runs of one-block regions with the
  // same policy and kind become per_block@A-B (or selective:POLICY@A-B, or
  // per_block:reentrant@A-B); a longer region is chunk@A-B (chunk:reentrant@A-B).
  std::vector<std::size_t> order(block_regions.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return block_regions[a].front() < block_regions[b].front();
  });
  for (std::size_t k = 0; k < order.size();) {
    const std::size_t r = order[k];
    const auto& g = block_regions[r];
    const std::string& pol = region_policy_names[r];
    const bool re = reentrant_region(r);
    const std::string kind = re ? ":reentrant" : "";
    if (g.size() > 1) {
      parts.push_back("chunk" + kind + range_str(g.front(), g.back(), n_layers));
      ++k;
      continue;
    }
    std::size_t e = k + 1;
    while (e < order.size() && block_regions[order[e]].size() == 1 &&
           block_regions[order[e]][0] == block_regions[order[e - 1]][0] + 1 && region_policy_names[order[e]] == pol &&
           reentrant_region(order[e]) == re)
      ++e;
    const std::int64_t lo = g[0], hi = block_regions[order[e - 1]][0];
    parts.push_back((pol.empty() ? std::string("per_block") : "selective:" + pol) + kind + range_str(lo, hi, n_layers));
    k = e;
  }
  // Module regions: runs of blocks with the same module.
  std::set<std::string> all;
  for (const auto& m : block_modules) all.insert(m.begin(), m.end());
  for (const auto& m : all) {
    for (std::int64_t b = 0; b < n_layers;) {
      if (!block_modules[std::size_t(b)].count(m)) {
        ++b;
        continue;
      }
      std::int64_t e = b;
      while (e + 1 < n_layers && block_modules[std::size_t(e + 1)].count(m)) ++e;
      parts.push_back((standalone(m) ? m : "selective:" + m) + range_str(b, e, n_layers));
      b = e + 1;
    }
  }
  auto range_of = [&](const std::optional<std::pair<std::int64_t, std::int64_t>>& r) {
    if (!r) return std::string();
    return "@" + std::to_string(r->first) + (r->second == r->first ? "" : "-" + std::to_string(r->second));
  };
  if (offload)
    parts.push_back("offload" + (offload_modules.empty() ? "" : ":" + join(offload_modules)) + range_of(offload_range));
  if (compress)
    parts.push_back(std::string("compress:") + compress_format_name(compress_format) +
                    (compress_all ? ":all" : compress_modules.empty() ? "" : ":" + join(compress_modules)) +
                    range_of(compress_range));
  if (chunked_loss) parts.push_back("chunked_loss" + (loss_chunk > 0 ? ":" + std::to_string(loss_chunk) : ""));
  if (keep_gathered) parts.push_back("keep_gathered" + range_of(keep_gathered_range));
  if (dynamic) parts.push_back("dynamic" + (dynamic_budget > 0 ? ":" + std::to_string(dynamic_budget) : ""));
  if (parts.empty()) return "none";
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : "+") + p;
  return out;
}

bool RecomputePlan::operator==(const RecomputePlan& o) const {
  auto normalised = [](const RecomputePlan& p) {
    std::vector<std::tuple<std::vector<std::int64_t>, std::string, bool>> r;
    for (std::size_t i = 0; i < p.block_regions.size(); ++i)
      r.emplace_back(p.block_regions[i], p.region_policy_names[i], p.reentrant_region(i));
    std::sort(r.begin(), r.end());
    return r;
  };
  return n_layers == o.n_layers && normalised(*this) == normalised(o) && block_modules == o.block_modules &&
         offload == o.offload && offload_modules == o.offload_modules && offload_range == o.offload_range &&
         compress == o.compress && (!compress || compress_format == o.compress_format) &&
         compress_modules == o.compress_modules && compress_all == o.compress_all && compress_range == o.compress_range &&
         chunked_loss == o.chunked_loss && loss_chunk == o.loss_chunk && keep_gathered == o.keep_gathered &&
         keep_gathered_range == o.keep_gathered_range && dynamic == o.dynamic && dynamic_budget == o.dynamic_budget;
}

const std::vector<std::string>& RecomputePlan::builtin_sub_regions() {
  static const std::vector<std::string> names = {"attention", "moe_expert", "core_attn", "layernorm",
                                                 "mlp",       "moe_act",    "moe",       "shared_experts"};
  return names;
}

namespace {

// Parses one plan string. Each component (split at '+') claims blocks (block-
// level regions) or sub-block parts (module regions) of the plan, or turns on
// offload / compression; a claim that overlaps an earlier one is an error
// naming both. The checks that need every component (keep_last, hooks on
// recomputed parts, module regions inside block regions) run at the end.
class PlanParser {
 public:
  PlanParser(const std::string& spec, std::int64_t n_layers, const std::vector<std::string>& sub_regions)
      : n_layers_(n_layers), sub_regions_(sub_regions), bad_{spec, sub_regions} {
    plan_.spec = spec;
  }

  RecomputePlan parse() {
    if (plan_.spec.empty()) bad_("empty plan");
    plan_.n_layers = n_layers_;
    plan_.block_modules.assign(std::size_t(n_layers_), {});
    if (plan_.spec == "none") return plan_;
    owner_.assign(std::size_t(n_layers_), -1);
    components_ = split(plan_.spec, '+');
    for (std::size_t c = 0; c < components_.size(); ++c) component(c);
    if (keep_last_) apply_keep_last();
    check_hook_modules(offload_comp_, plan_.offload_modules, plan_.offload_range);
    check_hook_modules(compress_comp_, plan_.compress_modules, plan_.compress_range);
    check_modules_outside_block_regions();
    return plan_;
  }

 private:
  // One component: its index, its text without the @range, and the blocks
  // it applies to (all of them unless ranged).
  struct Term {
    std::size_t index = 0;
    std::string text;
    std::int64_t lo = 0, hi = 0;
    bool ranged = false;
    bool reentrant = false;  // written C:reentrant (a block-level component only)
    const std::string& full(const PlanParser& p) const { return p.components_[index]; }
  };

  using Regions = std::vector<std::vector<std::int64_t>>;

  bool offered(const std::string& n) const {
    return std::find(sub_regions_.begin(), sub_regions_.end(), n) != sub_regions_.end();
  }

  // Splits off the @range and hands the component to the step for its kind.
  void component(std::size_t c) {
    Term t{c, components_[c], 0, n_layers_ - 1, false};
    if (const auto at = t.text.find('@'); at != std::string::npos) {
      parse_range(components_[c], t.text.substr(at + 1), t.lo, t.hi);
      t.ranged = true;
      t.text = t.text.substr(0, at);
    }
    reentrant_suffix(t);
    if (t.text == "keep_last") return keep_last_term(t);
    if (t.text == "keep_gathered") return keep_gathered_term(t);
    if (t.text == "offload" || t.text.rfind("offload:", 0) == 0) return offload_term(t);
    if (t.text.rfind("compress:", 0) == 0) return compress_term(t);
    if (t.text == "chunked_loss" || t.text.rfind("chunked_loss:", 0) == 0) return chunked_loss_term(t);
    if (t.text == "dynamic" || t.text.rfind("dynamic:", 0) == 0) return dynamic_term(t);
    region_term(t);
  }

  // ":reentrant" at the end of a component (before its @range): takes it off
  // and marks the term, refusing it on anything but block-level regions.
  void reentrant_suffix(Term& t) const {
    static const std::string suffix = ":reentrant";
    if (t.text.size() <= suffix.size() || t.text.compare(t.text.size() - suffix.size(), suffix.size(), suffix) != 0)
      return;
    t.text.resize(t.text.size() - suffix.size());
    t.reentrant = true;
    const auto colon = t.text.find(':');
    const std::string head = t.text.substr(0, colon), arg = colon == std::string::npos ? "" : t.text.substr(colon + 1);
    const bool has_arg = colon != std::string::npos;
    if (((t.text == "per_block" || t.text == "chunk") && !has_arg) ||
        ((head == "selected" || head == "uniform" || head == "block") && has_arg))
      return;
    const std::string comp = "'" + t.full(*this) + "': ";
    if (head == "selective" && arg.rfind("save_", 0) == 0)
      bad_(comp + "a reentrant region cannot hold an op policy (its replay runs every op again and keeps no cached "
           "output); write selective:" + arg + " for the policy, or per_block:reentrant for reentrant regions");
    if (standalone(t.text) || head == "selective")
      bad_(comp + "module regions (" + t.text + ") are non-reentrant only; :reentrant is for block-level regions "
           "(per_block, chunk, selected:I,J,..., uniform:N, block:N)");
    bad_(comp + ":reentrant is for block-level regions only (per_block, chunk, selected:I,J,..., uniform:N, "
         "block:N), not '" + t.text + "'");
  }

  // "@A-B" or "@A" after a component: the blocks it applies to.
  void parse_range(const std::string& comp, const std::string& text, std::int64_t& lo, std::int64_t& hi) const {
    const auto dash = text.find('-');
    lo = parse_int(bad_, "'" + comp + "': @", text.substr(0, dash));
    hi = dash == std::string::npos ? lo : parse_int(bad_, "'" + comp + "': @A-", text.substr(dash + 1));
    if (lo > hi || hi >= n_layers_)
      bad_("'" + comp + "': block range @" + text + " needs A <= B < " + std::to_string(n_layers_) +
           " (the model has " + std::to_string(n_layers_) + " blocks)");
  }

  void keep_last_term(const Term& t) {
    if (t.ranged) bad_("'keep_last' takes no @range (it is about the last block)");
    if (keep_last_) bad_("'keep_last' given twice");
    keep_last_ = true;
  }

  // keep_gathered[@A-B]
  void keep_gathered_term(const Term& t) {
    if (plan_.keep_gathered) bad_("'" + t.full(*this) + "': keep_gathered given twice");
    plan_.keep_gathered = true;
    if (t.ranged) plan_.keep_gathered_range = std::make_pair(t.lo, t.hi);
  }

  // chunked_loss[:N]
  void chunked_loss_term(const Term& t) {
    if (t.ranged) bad_("'" + t.full(*this) + "': chunked_loss takes no @range (the loss comes after the blocks)");
    if (plan_.chunked_loss) bad_("'" + t.full(*this) + "': chunked_loss given twice");
    plan_.chunked_loss = true;
    if (t.text == "chunked_loss") return;
    const std::int64_t n = parse_int(bad_, "'" + t.text + "': N", t.text.substr(13));
    if (n < 1) bad_("'" + t.text + "': a chunk must be at least 1 token, got " + std::to_string(n));
    plan_.loss_chunk = n;
  }

  // dynamic[:BYTES]
  void dynamic_term(const Term& t) {
    if (t.ranged) bad_("'" + t.full(*this) + "': dynamic takes no @range (its budget covers the whole step)");
    if (plan_.dynamic) bad_("'" + t.full(*this) + "': dynamic given twice");
    plan_.dynamic = true;
    if (t.text == "dynamic") return;
    const std::int64_t n = parse_int(bad_, "'" + t.text + "': BYTES", t.text.substr(8));
    if (n < 1) bad_("'" + t.text + "': the budget must be at least 1 byte, got " + std::to_string(n));
    plan_.dynamic_budget = n;
  }

  // offload[:NAMES]
  void offload_term(const Term& t) {
    if (plan_.offload) bad_("'" + offload_comp_ + "' and '" + t.full(*this) + "': offload given twice");
    plan_.offload = true;
    offload_comp_ = t.full(*this);
    if (t.ranged) plan_.offload_range = std::make_pair(t.lo, t.hi);
    if (t.text != "offload") plan_.offload_modules = hook_modules(t.text, t.text.substr(8));
  }

  // compress:FMT[:NAMES|all]
  void compress_term(const Term& t) {
    if (plan_.compress) bad_("'" + compress_comp_ + "' and '" + t.full(*this) + "': compress given twice");
    const std::string rest = t.text.substr(9);
    const auto colon2 = rest.find(':');
    const std::string fmt = rest.substr(0, colon2);
    if (fmt != "bf16" && fmt != "fp8") bad_("'" + t.text + "': unknown format '" + fmt + "' (bf16 or fp8)");
    plan_.compress = true;
    plan_.compress_format = compress_format_from_name(fmt);
    compress_comp_ = t.full(*this);
    if (t.ranged) plan_.compress_range = std::make_pair(t.lo, t.hi);
    if (colon2 == std::string::npos) return;
    if (rest.substr(colon2 + 1) == "all")
      plan_.compress_all = true;  // every floating save, not only matmul inputs and boundaries
    else
      plan_.compress_modules = hook_modules(t.text, rest.substr(colon2 + 1));
  }

  // Sub-regions named by offload:/compress: (their saves get the hooks).
  std::set<std::string> hook_modules(const std::string& comp, const std::string& list) const {
    std::set<std::string> out;
    for (const auto& name : split(list, ',')) {
      if (!offered(name)) bad_("'" + comp + "' names '" + name + "', which is not a sub-region the blocks offer");
      if (name == "moe_act")
        bad_("'" + comp + "': moe_act is an output-discard of the expert activation and keeps no saves of its own");
      out.insert(name);
    }
    return out;
  }

  // The components that make regions: none, per_block, chunk, selected:,
  // uniform:, block:, a standalone sub-region, selective:.
  void region_term(const Term& t) {
    const auto colon = t.text.find(':');
    const std::string head = t.text.substr(0, colon);
    const std::string arg = colon == std::string::npos ? "" : t.text.substr(colon + 1);
    const bool has_arg = colon != std::string::npos;
    if (t.text == "none") {
      if (components_.size() > 1) bad_("'none' cannot be combined");
    } else if (t.text == "per_block") {
      claim_blocks(t, each(t.lo, t.hi));
    } else if (t.text == "chunk") {
      std::vector<std::int64_t> all;
      for (std::int64_t i = t.lo; i <= t.hi; ++i) all.push_back(i);
      claim_blocks(t, {all});
    } else if ((head == "selected" || head == "block") && has_arg && t.ranged) {
      bad_("'" + t.full(*this) + "': " + head + ":... names its blocks itself and takes no @range");
    } else if (head == "selected" && has_arg) {
      selected_term(t, arg);
    } else if (head == "uniform" && has_arg) {
      uniform_term(t, arg);
    } else if (head == "block" && has_arg) {
      block_term(t, arg);
    } else if (standalone(t.text) && offered(t.text)) {
      claim_module(t.index, t.text, t.lo, t.hi);
    } else if (head == "selective" && has_arg) {
      for (const auto& name : split(arg, ',')) selective_name(t, name);
    } else {
      bad_("unknown component '" + t.full(*this) + "'" +
           (!standalone(t.text) && offered(t.text) ? " (a sub-region: write selective:" + t.text + ")" : ""));
    }
  }

  // selected:I,J,...: one region per named block.
  void selected_term(const Term& t, const std::string& arg) {
    Regions r;
    for (const auto& s : split(arg, ',')) {
      const std::int64_t i = parse_int(bad_, "selected", s);
      if (i >= n_layers_)
        bad_("block " + s + " does not exist (the model has " + std::to_string(n_layers_) + " blocks)");
      r.push_back({i});
    }
    claim_blocks(t, r);
  }

  // uniform:N: consecutive groups of N blocks of the range.
  void uniform_term(const Term& t, const std::string& arg) {
    const std::int64_t g = parse_int(bad_, "uniform", arg);
    if (g < 1 || g > t.hi - t.lo + 1) bad_("uniform:N needs 1 <= N <= " + std::to_string(t.hi - t.lo + 1));
    Regions r;
    for (std::int64_t i = t.lo; i <= t.hi; i += g) {
      std::vector<std::int64_t> grp;
      for (std::int64_t j = i; j < std::min(t.hi + 1, i + g); ++j) grp.push_back(j);
      r.push_back(grp);
    }
    claim_blocks(t, r);
  }

  // block:N: the first N blocks, one region each.
  void block_term(const Term& t, const std::string& arg) {
    const std::int64_t n = parse_int(bad_, "block", arg);
    if (n > n_layers_) bad_("block:N needs N <= " + std::to_string(n_layers_));
    Regions r;
    for (std::int64_t i = 0; i < n; ++i) r.push_back({i});
    claim_blocks(t, r);
  }

  // One name of selective:NAMES: an op policy (per-block regions) or a
  // sub-region the blocks offer.
  void selective_name(const Term& t, const std::string& name) {
    if (name == "save_matmul" || name == "save_attention" || name.rfind("save_ops=", 0) == 0) {
      if (plan_.policy && !t.ranged) bad_("only one op policy per plan (or give each its @range)");
      plan_.policy = op_policy(name);
      plan_.policy_name = name;
      claim_blocks(t, each(t.lo, t.hi), plan_.policy, name);
    } else if (!standalone(name) && offered(name)) {
      claim_module(t.index, name, t.lo, t.hi);
    } else {
      bad_("unknown selective name '" + name + "' in '" + t.text + "' (" +
           (standalone(name) && offered(name) ? "'" + name + "' is a component of its own, without selective:"
                                              : "neither a sub-region the blocks offer nor an op policy") + ")");
    }
  }

  // save_matmul, save_attention or save_ops=OP/OP/...
  Policy op_policy(const std::string& name) const {
    if (name == "save_matmul") return save_matmul_outputs();
    if (name == "save_attention") return save_attention_outputs();
    auto ops = split(name.substr(9), '/');
    if (ops.empty() || ops[0].empty())
      bad_("save_ops= needs op names, e.g. save_ops=matmul/scaled_dot_product_attention");
    for (const auto& op : ops)
      if (!replay_cacheable(op))
        bad_("save_ops=: op '" + op +
             "' cannot hand back cached outputs (a replay would run its kernel anyway); "
             "valid ops: " + replay_cacheable_list());
    return save_ops(ops);
  }

  // One region per block of [lo, hi].
  static Regions each(std::int64_t lo, std::int64_t hi) {
    Regions r;
    for (std::int64_t i = lo; i <= hi; ++i) r.push_back({i});
    return r;
  }

  // Term `t` makes `regions` block-level regions (each block in one region
  // only), reentrant if it says so.
  void claim_blocks(const Term& t, const Regions& regions, const Policy& policy = nullptr,
                    const std::string& policy_name = "") {
    const std::size_t comp = t.index;
    for (const auto& r : regions)
      for (auto b : r) {
        if (owner_[std::size_t(b)] >= 0)
          bad_("'" + components_[std::size_t(owner_[std::size_t(b)])] + "' and '" + components_[comp] +
               "' overlap at block " + std::to_string(b) + " (a block can be in only one region)");
        owner_[std::size_t(b)] = std::int64_t(comp);
      }
    for (const auto& r : regions) {
      plan_.block_regions.push_back(r);
      plan_.region_policies.push_back(policy);
      plan_.region_policy_names.push_back(policy_name);
      plan_.region_reentrant.push_back(t.reentrant);
    }
  }

  // Component `comp` makes `module` a region in blocks lo..hi (each sub-block
  // part in one module region only).
  void claim_module(std::size_t comp, const std::string& module, std::int64_t lo, std::int64_t hi) {
    for (std::int64_t b = lo; b <= hi; ++b)
      for (const auto& p : parts_of(module)) {
        auto it = part_owner_.find({b, p});
        if (it != part_owner_.end())
          bad_("'" + it->second + "' and '" + components_[comp] + "' overlap (both cover " + p +
               (lo == 0 && hi == n_layers_ - 1 ? std::string() : " in block " + std::to_string(b)) + ")");
        part_owner_[{b, p}] = components_[comp];
      }
    for (std::int64_t b = lo; b <= hi; ++b) plan_.block_modules[std::size_t(b)].insert(module);
    plan_.modules.insert(module);
  }

  // keep_last: the last block leaves its block-level region (its backward
  // starts right after the forward, so replaying it would redo work to free
  // memory that is needed again at once).
  void apply_keep_last() {
    std::int64_t last = -1;
    for (const auto& r : plan_.block_regions)
      for (auto b : r) last = std::max(last, b);
    if (last < 0) bad_("'keep_last' needs block-level regions (per_block, chunk, uniform:N, ...) to take the last block from");
    for (auto& r : plan_.block_regions) r.erase(std::remove(r.begin(), r.end(), last), r.end());
    for (std::size_t i = plan_.block_regions.size(); i-- > 0;)
      if (plan_.block_regions[i].empty()) {
        plan_.block_regions.erase(plan_.block_regions.begin() + std::ptrdiff_t(i));
        plan_.region_policies.erase(plan_.region_policies.begin() + std::ptrdiff_t(i));
        plan_.region_policy_names.erase(plan_.region_policy_names.begin() + std::ptrdiff_t(i));
        plan_.region_reentrant.erase(plan_.region_reentrant.begin() + std::ptrdiff_t(i));
      }
    owner_[std::size_t(last)] = -1;
  }

  // Hooks on sub-regions that a region recomputes have nothing to pack.
  void check_hook_modules(const std::string& comp, const std::set<std::string>& mods,
                          const std::optional<std::pair<std::int64_t, std::int64_t>>& range) const {
    if (mods.empty()) return;
    const std::int64_t lo = range ? range->first : 0, hi = range ? range->second : n_layers_ - 1;
    for (const auto& m : mods)
      for (std::int64_t b = lo; b <= hi; ++b)
        for (const auto& r : plan_.block_modules[std::size_t(b)]) {
          const auto pm = parts_of(m), pr = parts_of(r);
          for (const auto& p : pm)
            if (pr.count(p))
              bad_("'" + comp + "' and the '" + r + "' regions: " + m + "'s saves are recomputed there, not kept, so " +
                   "there is nothing to " + (comp.rfind("offload", 0) == 0 ? "offload" : "compress"));
        }
    bool any_plain_block = false;
    for (std::int64_t b = lo; b <= hi; ++b) any_plain_block = any_plain_block || owner_[std::size_t(b)] < 0;
    const std::string base = comp.substr(0, comp.find('@'));
    if (!any_plain_block)
      bad_("'" + comp + "': every block " + (range ? "of its range " : "") + "is in a block-level region, so the " +
           "saves inside its sub-regions are recomputed, not kept; use '" + base.substr(0, base.rfind(':')) +
           "' (without names) to act on the regions' boundaries");
  }

  // Module regions live inside blocks: they cannot share a block with a block region.
  void check_modules_outside_block_regions() const {
    for (std::int64_t b = 0; b < n_layers_; ++b)
      if (owner_[std::size_t(b)] >= 0 && !plan_.block_modules[std::size_t(b)].empty())
        bad_("'" + components_[std::size_t(owner_[std::size_t(b)])] + "' and the module regions (" +
             *plan_.block_modules[std::size_t(b)].begin() + ") overlap at block " + std::to_string(b) +
             " (module regions would nest inside the block's region)");
  }

  const std::int64_t n_layers_;
  const std::vector<std::string>& sub_regions_;
  const Bad bad_;
  RecomputePlan plan_;
  std::vector<std::string> components_;
  std::vector<std::int64_t> owner_;  // block -> index of the component whose region holds it, or -1
  std::map<std::pair<std::int64_t, std::string>, std::string> part_owner_;  // (block, sub-block part) -> component
  std::string offload_comp_, compress_comp_;  // the components that turned them on
  bool keep_last_ = false;
};

// Sub-region names are usable in a plan: letters, digits and '_', not
// "save_*" (op policies), "all" (compress:FMT:all) nor "reentrant"
// (C:reentrant).
void check_sub_region_names(const std::vector<std::string>& sub_regions) {
  for (const auto& n : sub_regions)
    REMAT_CHECK(!n.empty() && n.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") ==
                                  std::string::npos && n.rfind("save_", 0) != 0 && n != "all" &&
                    n != "reentrant",
                Error, "recompute plans: sub-region name '", n,
                "' is not usable in a plan (names are letters, digits and '_', do not start with 'save_', "
                "which names op policies, and are not 'all', which compress:FMT:all means, nor 'reentrant', which "
                "C:reentrant means)");
}

}  // namespace

RecomputePlan RecomputePlan::parse(const std::string& spec, std::int64_t n_layers,
                                   const std::vector<std::string>& sub_regions) {
  check_sub_region_names(sub_regions);
  return PlanParser(spec, n_layers, sub_regions).parse();
}

}  // namespace remat
