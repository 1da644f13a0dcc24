#include "train/parallel_layout.h"

#include <algorithm>
#include <sstream>

#include "moe/expert_parallel.h"

namespace remat {

ParallelLayout make_parallel_layout(std::shared_ptr<ProcessGroup> world, std::int64_t ep, const ModelConfig& c) {
  const int W = world->size();
  REMAT_CHECK(ep >= 1 && W % ep == 0, Error, "--ep ", ep, ": the expert-parallel degree must divide the ", W,
              " ranks of the job");
  REMAT_CHECK(ep == 1 || (c.experts > 0 && c.experts % ep == 0), Error, "--ep ", ep, ": config '", c.name,
              "' has ", c.experts, " routed experts, which cannot be split evenly over ", ep, " ranks");
  REMAT_CHECK(c.batch % W == 0, Error, "config '", c.name, "' has a global batch of ", c.batch,
              " sequences, which does not divide evenly over ", W, " ranks");
  ParallelLayout l;
  l.world = world;
  l.ep = ep;
  if (W == 1) {
    l.ep_group = world;
    l.expert_replicas = world;
    return l;
  }
  const int k = int(ep);
  l.ep_group = world->split_by([k](int r) { return std::pair{r / k, r}; });
  l.expert_replicas = world->split_by([k](int r) { return std::pair{r % k, r}; });
  l.grad_group = world->split_by([](int r) { return std::pair{0, r}; });
  return l;
}

std::string WorldSpec::str() const {
  return "dp=" + std::to_string(dp) + ",ep=" + std::to_string(ep) + ",pp=" + std::to_string(pp) +
         (zero > 0 ? ",zero=" + std::to_string(zero) : "") + (tp > 1 ? ",tp=" + std::to_string(tp) : "") +
         (sp ? ",sp" : "");
}

WorldSpec parse_world_spec(const std::string& text) {
  const std::string form = "expected dp=D,ep=E,pp=P,zero=S,tp=T,sp (any of them; the others are 1, zero 0, sp off), "
                           "e.g. dp=8,pp=4 or dp=2,tp=8,sp";
  WorldSpec w;
  std::vector<std::string> seen;
  std::stringstream items(text);
  for (std::string item; std::getline(items, item, ',');) {
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq);
    if (item == "sp") {
      REMAT_CHECK(!w.sp, Error, "world '", text, "': sp is given twice; ", form);
      w.sp = true;
      continue;
    }
    REMAT_CHECK(eq != std::string::npos && (key == "dp" || key == "ep" || key == "pp" || key == "zero" || key == "tp"),
                Error,
                "world '", text,
                "': '", item, "' is not an axis; ", form);
    REMAT_CHECK(std::find(seen.begin(), seen.end(), key) == seen.end(), Error, "world '", text, "': ", key,
                " is given twice; ", form);
    seen.push_back(key);
    std::int64_t v = 0;
    std::size_t used = 0;
    try {
      v = std::stoll(item.substr(eq + 1), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    const bool zero = key == "zero";
    REMAT_CHECK(used > 0 && used == item.size() - eq - 1 && (zero ? v >= 0 && v <= 3 : v >= 1), Error, "world '",
                text, "': ", key, " must be ", zero ? "0, 1, 2 or 3" : "a whole number >= 1", ", got '",
                item.substr(eq + 1), "'; ", form);
    (key == "dp" ? w.dp : key == "ep" ? w.ep : key == "pp" ? w.pp : key == "tp" ? w.tp : w.zero) = v;
  }
  REMAT_CHECK(!seen.empty(), Error, "world '", text, "': names no axis; ", form);
  REMAT_CHECK(!w.sp || w.tp > 1, Error, "world '", text, "': sp shards the sequence over the tensor-parallel ranks; "
              "it needs tp >= 2");
  REMAT_CHECK(w.dp % w.ep == 0, Error, "world '", text, "': ep=", w.ep, " must divide dp=", w.dp,
              " (the experts are split within each stage's data-parallel ranks)");
  REMAT_CHECK(w.zero == 0 || w.dp > 1, Error, "world '", text, "': zero=", w.zero,
              " shards over the data-parallel ranks; it needs dp >= 2");
  return w;
}

JobGroups split_job_groups(std::shared_ptr<ProcessGroup> job, std::int64_t pp, std::int64_t dp,
                           const ModelConfig& c) {
  if (pp <= 1) {
    REMAT_CHECK(pp == 1, Error, "--pp must be >= 1, got ", pp);
    return {job, nullptr};
  }
  auto refuse = [&](bool bad, const std::string& what) { REMAT_CHECK(!bad, Error, "--pp ", pp, ": ", what); };
  const int P = int(pp), N = job->size();
  refuse(N % P != 0, "this job has " + std::to_string(N) + " rank(s), not a multiple of " + std::to_string(P) +
         " stages; start it with `mpirun -np " + std::to_string(P) + " ./remat train ... --pp " +
         std::to_string(P) + "` (one rank per stage), or P x D ranks for D data-parallel replicas");
  const int D = N / P;
  refuse(dp > 0 && dp != D, "--dp " + std::to_string(dp) + " needs " + std::to_string(P * dp) +
         " ranks (pp x dp), this job has " + std::to_string(N));
  refuse(c.tie_embeddings, "tied embeddings live on the first and the last stage; not built yet");
  JobGroups g;  // (collectives over the job: every rank, in this order)
  g.pipeline = job->split_by([D](int r) { return std::pair{r % D, r / D}; });  // replica d's stages
  g.world = D == 1 ? single_process_group() : job->split_by([D](int r) { return std::pair{r / D, r % D}; });
  return g;
}

std::vector<std::shared_ptr<ProcessGroup>> ParallelLayout::groups() const {
  std::vector<std::shared_ptr<ProcessGroup>> g;
  for (const auto& p : {world, ep_group, expert_replicas, grad_group})
    if (p && std::find(g.begin(), g.end(), p) == g.end()) g.push_back(p);
  return g;
}

CommCounters ParallelLayout::counters() const {
  CommCounters c;
  for (const auto& g : groups()) c = c + g->counters();
  return c;
}

std::unique_ptr<GradReducer> make_grad_reducer(const ParallelLayout& layout,
                                               const std::vector<std::pair<std::string, Tensor>>& params,
                                               std::int64_t bucket_bytes) {
  if (layout.world->size() <= 1) return nullptr;
  std::vector<ReducedParameter> reduced;
  for (const auto& [name, p] : params) {
    const bool expert = is_expert_parameter(name);
    reduced.push_back({name, p, expert ? layout.expert_replicas : layout.grad_group, expert});
  }
  return std::make_unique<GradReducer>(std::move(reduced), bucket_bytes);
}

void apply_parallel_layout(DecoderModel& model, const ParallelLayout& layout, bool reuse_routing_metadata) {
  std::shared_ptr<BatchGroup> batch;
  if (layout.world->size() > 1) batch = std::make_shared<ProcessBatchGroup>(layout.world);
  for (auto& block : model.model->layers) {
    if (!block->moe) continue;
    if (batch) block->moe->batch = batch;
    block->moe->reuse_routing_metadata = reuse_routing_metadata;
    if (layout.ep > 1) {
      const std::size_t base = std::size_t(layout.world->rank() - layout.ep_group->rank());
      block->moe->dispatcher = std::make_shared<ExpertParallelDispatcher>(layout.ep_group, base);
    }
  }
}

Tensor batch_shard(const Tensor& global, const ProcessGroup& group) {
  const int W = group.size();
  if (W == 1) return global;
  REMAT_CHECK(global.size(0) % W == 0, ShapeError, "batch_shard: a batch of ", global.size(0),
              " does not split evenly over ", W, " ranks");
  const std::int64_t b = global.size(0) / W;
  return global.narrow(0, group.rank() * b, b).contiguous();
}

bool is_expert_parameter(const std::string& name) { return routed_expert_name(name).expert >= 0; }

}  // namespace remat
