#include "tools/auto_plan_flags.h"

#include <cstdio>

#include "checkpoint/time_estimate.h"
#include "engine/allocator.h"
#include "engine/error.h"
#include "parallel/process_group.h"

namespace remat::tools {

std::vector<FlagSpec> auto_plan_flag_specs() {
  return {text_flag("memory-budget", "with --recompute auto: peak allocated bytes on the device, with a unit (1.5GiB, "
                    "700MiB) or N% (persistent bytes, and ZeRO's working set, plus N% of plan none's activation bytes)"),
          bool_flag("allow-lossy", "with --recompute auto: the planner may also compress saved tensors (bf16, fp8)"),
          bool_flag("tune-microbatch", "train with --recompute auto: also choose the micro-batches per step "
                    "(--grad-accum) at the same global batch, for the least predicted step time"),
          int_flag("profile-rounds", "with --recompute auto: measured steps per plan component in the profile", 3,
                   {.min = 1, .max = 100}),
          text_flag("device-model", "the device step times are estimated for (with --device meta, and mem's "
                    "estimate): h100, h200, b200 or cpu-measured", "cpu-measured")};
}

std::vector<FlagSpec> simulate_flag_specs() {
  return {text_flag("simulate-world", "dp=D,ep=E,pp=P: one rank of a job that is not running, on meta (docs/META.md)"),
          int_flag("simulate-rank", "the rank of --simulate-world (stage-major: rank s*D + d)", 0, {.min = 0})};
}

std::optional<SimulatedRank> simulated_rank_flags(const Flags& f, Device device) {
  REMAT_CHECK(f.has("simulate-world") || !f.has("simulate-rank"), Error, f.command(),
              ": --simulate-rank needs --simulate-world dp=D,ep=E,pp=P");
  if (!f.has("simulate-world")) return std::nullopt;
  SimulatedRank r;
  r.world = parse_world_spec(f.get("simulate-world"));
  REMAT_CHECK(device.is_meta(), DeviceError, f.command(), ": --simulate-world runs one rank of a job that is not "
              "running, on shapes alone; add --device meta");
  r.rank = int(f.get_int("simulate-rank"));
  REMAT_CHECK(r.rank < r.world.ranks(), Error, f.command(), ": --simulate-rank ", r.rank, ": the job ", r.world.str(),
              " has ranks 0 to ", r.world.ranks() - 1);
  return r;
}

void scale_simulated_batch(ModelConfig& c, const SimulatedRank& r, std::int64_t micro_batches) {
  c.batch *= r.world.dp * micro_batches;
}

std::vector<FlagSpec> with_auto_plan_flags(std::vector<FlagSpec> specs) {
  for (auto& s : auto_plan_flag_specs()) specs.push_back(std::move(s));
  return specs;
}

ProfileOptions profile_options_for_flags(const Flags& f, const ModelConfig& c, const std::string& dtype, Device device,
                                         std::uint64_t seed, bool verbose, const ProfileJob& job) {
  ProfileOptions o;
  if (f.has("model") && (c.lora.enabled() || !c.freeze.empty())) o.weights_dir = f.get("model");
  if (const auto world = world_group(); world->size() > 1) {
    REMAT_CHECK(job.pp == 1, Error, f.command(), " --recompute auto under --pp ", job.pp, ": the planner profiles "
                "the blocks of data- and expert-parallel ranks, not a pipeline's stages; choose each stage's plan "
                "with ./remat plan (--simulate-world on meta) and pass it to --recompute");
    o.job = world;
    o.ep = job.ep;
    o.zero = job.zero;
    o.tp = job.tp;
    o.sp = job.sp;
  }
  o.config = c;
  o.dtype = dtype;
  o.device = device;
  o.seed = seed;
  o.rounds = f.get_int("profile-rounds");
  o.device_model = f.get("device-model");
  check_device_model(o.device_model);
  o.allow_lossy = f.get_bool("allow-lossy");
  if (f.has("offload-dir")) o.offload_dir = f.get("offload-dir");
  if (const auto r = simulated_rank_flags(f, device)) {
    o.world = r->world;
    o.rank = r->rank;
  }
  if (verbose)
    o.progress = [](const std::string& line) {
      std::fprintf(stderr, "  %s\n", line.c_str());
      std::fflush(stderr);
    };
  return o;
}

CheckedPlan checked_choice(const Flags& f, const PlanProfile& prof, const ProfileOptions& opts,
                           const std::string& budget_text) {
  const std::int64_t budget = parse_memory_budget(budget_text, prof);
  CheckedPlan r = choose_checked_plan(prof, opts, budget, f.get_bool("allow-lossy"));
  REMAT_CHECK(r.checked || r.measured_peak <= budget, Error, "--memory-budget ", budget_text, " (",
              format_mib(budget), "): the planner's choice ", r.plan.best.plan, " (predicted peak ",
              format_mib(r.plan.best.peak), ") measured ", format_mib(r.measured_peak),
              " when run, and no tighter plan fits; the smallest predicted peak is ", format_mib(r.plan.smallest.peak),
              " (--recompute ", r.plan.smallest.plan, ")");
  return r;
}

std::int64_t dynamic_budget_bytes(const Flags& f, const ModelConfig& c, const std::string& dtype, Device device,
                                  std::uint64_t seed, const ProfileJob& job) {
  REMAT_CHECK(f.has("memory-budget"), Error,
              "--recompute dynamic needs --memory-budget B (bytes with a unit, e.g. 1.5GiB, or N% of plan none's "
              "activation bytes), or the budget in the plan (dynamic:BYTES)");
  const std::string text = f.get("memory-budget");
  if (text.empty() || text.back() != '%') return parse_memory_budget(text, PlanProfile{});
  // N%: of plan none's activations above the persistent bytes, from a profile of none alone.
  ProfileOptions opts = profile_options_for_flags(f, c, dtype, device, seed, false, job);
  opts.candidates = {"none"};
  opts.rounds = 1;
  const std::int64_t budget = parse_memory_budget(text, profile_plans(opts));
  // The profile's segments go back, so the run's reserved bytes are its own.
  allocator_for(device).empty_cache();
  return budget;
}

std::string resolve_dynamic(const Flags& f, RecomputePlan plan, const ModelConfig& c, const std::string& dtype,
                            Device device, std::uint64_t seed, const ProfileJob& job) {
  plan.dynamic_budget = dynamic_budget_bytes(f, c, dtype, device, seed, job);
  REMAT_CHECK(plan.dynamic_budget > 0, Error, "--memory-budget ", f.get("memory-budget"), ": the budget is 0 bytes");
  const std::string resolved = plan.str();
  if (world_group()->rank() == 0)
    std::printf("recompute dynamic: a budget of %s for --memory-budget %s: --recompute %s\n",
                format_mib(plan.dynamic_budget).c_str(), f.get("memory-budget").c_str(), resolved.c_str());
  std::fflush(stdout);
  return resolved;
}

std::string resolve_recompute(const Flags& f, const std::string& recompute, const ModelConfig& c,
                              const std::string& dtype, Device device, std::uint64_t seed, const ProfileJob& job) {
  if (recompute != "auto") {
    const RecomputePlan plan = RecomputePlan::parse(recompute, c.n_layers);
    if (plan.dynamic && plan.dynamic_budget == 0) return resolve_dynamic(f, plan, c, dtype, device, seed, job);
    REMAT_CHECK(!f.has("memory-budget") || !plan.dynamic, Error, "--memory-budget ", f.get("memory-budget"),
                " and --recompute ", recompute, " both give dynamic's budget: give one of them");
    REMAT_CHECK(!f.has("memory-budget"), Error, "--memory-budget ", f.get("memory-budget"),
                " needs --recompute auto or a plan with dynamic (got --recompute ", recompute, ")");
    return recompute;
  }
  REMAT_CHECK(f.has("memory-budget"), Error,
              "--recompute auto needs --memory-budget B (bytes with a unit, e.g. 1.5GiB, or N% of plan none's "
              "activation bytes)");
  const ProfileOptions opts = profile_options_for_flags(f, c, dtype, device, seed, false, job);
  const PlanProfile prof = profile_plans(opts);
  const CheckedPlan r = checked_choice(f, prof, opts, f.get("memory-budget"));
  const AutoPlan& a = r.plan;
  if (world_group()->rank() == 0)  // (under mpirun every rank chose the same)
    std::printf("recompute auto: %s for --memory-budget %s (%s): predicted peak %s (a checking run: %s), step %.0f "
                "ms (profile of %zu plans, %.0f s)\n",
                a.best.plan.c_str(), f.get("memory-budget").c_str(), format_mib(a.budget).c_str(),
                format_mib(a.best.peak).c_str(), format_mib(r.measured_peak).c_str(), a.predicted_step_ms,
                prof.candidates.size(), prof.seconds);
  std::fflush(stdout);
  return a.best.plan;
}

std::string resolve_recompute_and_microbatch(const Flags& f, const ModelConfig& c, const std::string& dtype,
                                             Device device, std::uint64_t seed, std::int64_t* grad_accum) {
  REMAT_CHECK(f.has("memory-budget"), Error, "--tune-microbatch needs --recompute auto --memory-budget B");
  REMAT_CHECK(world_group()->size() == 1, Error, "--tune-microbatch profiles one process; under mpirun choose with "
              "./remat plan and pass --recompute and --grad-accum");
  // The budget is read against the whole batch's plan-none profile (N% means
  // the same bytes for every M).
  std::string best_plan;
  double best_ms = 0;
  std::int64_t best_m = 0, budget = -1;
  for (std::int64_t m = 1; m <= c.batch; m *= 2) {
    if (c.batch % m) continue;
    ModelConfig mc = c;
    mc.batch = c.batch / m;
    const ProfileOptions opts = profile_options_for_flags(f, mc, dtype, device, seed, false);
    const PlanProfile prof = profile_plans(opts);
    if (budget < 0) budget = parse_memory_budget(f.get("memory-budget"), prof);
    try {
      const CheckedPlan r = choose_checked_plan(prof, opts, budget, f.get_bool("allow-lossy"));
      const double ms = double(m) * r.plan.predicted_step_ms;
      std::printf("recompute auto: %lld micro-batch%s of %lld: %s, predicted peak %s (checked %s), step %.0f ms%s\n",
                  static_cast<long long>(m), m == 1 ? "" : "es", static_cast<long long>(mc.batch),
                  r.plan.best.plan.c_str(), format_mib(r.plan.best.peak).c_str(),
                  format_mib(r.measured_peak).c_str(), ms, r.checked || r.measured_peak <= budget ? "" : " (over)");
      if ((r.checked || r.measured_peak <= budget) && (best_m == 0 || ms < best_ms)) {
        best_plan = r.plan.best.plan;
        best_ms = ms;
        best_m = m;
      }
    } catch (const Error& e) {
      std::printf("recompute auto: %lld micro-batch%s of %lld: no plan fits (%s)\n", static_cast<long long>(m),
                  m == 1 ? "" : "es", static_cast<long long>(mc.batch), e.what());
    }
  }
  REMAT_CHECK(best_m > 0, Error, "--memory-budget ", f.get("memory-budget"), " (", format_mib(budget),
              "): no plan fits at any micro-batch size (see the lines above)");
  std::printf("recompute auto: %s with --grad-accum %lld (predicted step %.0f ms)\n", best_plan.c_str(),
              static_cast<long long>(best_m), best_ms);
  std::fflush(stdout);
  *grad_accum = best_m;
  return best_plan;
}

}  // namespace remat::tools
