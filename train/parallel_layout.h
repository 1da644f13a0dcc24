// Data and expert parallel layout of a decoder model over a ProcessGroup:
// the groups of a run, placing a model's MoE layers on them, a rank's share
// of the batch, and the gradient reducer of a data-parallel run.
//
// Every rank of the world shares one global batch (each rank takes its
// consecutive 1/W of the sequences). With --ep K the world is cut into
// expert-parallel groups of K consecutive ranks; rank j of a group holds
// experts [j*E/K, (j+1)*E/K) (the dispatcher is moe/expert_parallel.h).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/config.h"
#include "models/decoder.h"
#include "parallel/grad_reducer.h"
#include "parallel/process_group.h"

namespace remat {

// The shape of a job: dp data-parallel replicas (ep of them split the
// experts) of a pipeline of pp stages, each stage's blocks split over tp
// tensor-parallel ranks (sequence parallel with sp), tp x dp x pp ranks;
// zero: the ZeRO stage over the data-parallel replicas (0: none).
struct WorldSpec {
  std::int64_t dp = 1, ep = 1, pp = 1, zero = 0, tp = 1;
  bool sp = false;
  std::int64_t ranks() const { return dp * pp * tp; }
  std::string str() const;  // "dp=8,ep=1,pp=4" (",zero=S" when S > 0, ",tp=T" when T > 1, ",sp")
};
// "dp=D,ep=E,pp=P,zero=S,tp=T,sp" (any of them, any order; the rest 1, zero
// 0, sp off). Error naming the text and the expected form for an unknown
// key, a value < 1 (zero: not 0-3), a key given twice, ep not dividing dp,
// zero > 0 with dp = 1, or sp without tp >= 2.
WorldSpec parse_world_spec(const std::string& text);

// The groups of one rank of a job of pp x dp ranks, stage-major: rank
// s * D + d runs stage s of data-parallel replica d (D = job size / pp).
struct JobGroups {
  std::shared_ptr<ProcessGroup> world;     // this rank's data-parallel replicas (of its stage)
  std::shared_ptr<ProcessGroup> pipeline;  // replica d's pp stages (null when pp == 1)
};
// pp == 1: {job, null}. Error naming --pp when the job's size is not a
// multiple of pp, when dp (0: any) is not size / pp, or when the config ties
// its embeddings (they would live on two stages). A collective over `job`.
JobGroups split_job_groups(std::shared_ptr<ProcessGroup> job, std::int64_t pp, std::int64_t dp, const ModelConfig& c);

// The groups of a run on `world` with expert-parallel degree `ep`.
struct ParallelLayout {
  std::shared_ptr<ProcessGroup> world;
  std::shared_ptr<ProcessGroup> ep_group;         // the K ranks that split the experts
  std::shared_ptr<ProcessGroup> expert_replicas;  // the ranks holding the same experts (W / K)
  // The world again, on a communicator of its own for gradient buckets, so
  // their asynchronous all-reduces never interleave with the model's
  // collectives (null in one process).
  std::shared_ptr<ProcessGroup> grad_group;
  std::int64_t ep = 1;
  ExpertPlacement placement() const { return {ep_group->rank(), ep}; }
  // Every distinct group above (for totalling their counters).
  std::vector<std::shared_ptr<ProcessGroup>> groups() const;
  // The sum of their counters.
  CommCounters counters() const;
};
// Validates ep against the world and the config (the world size must divide
// the batch, ep must divide the world size and the expert count) and builds
// the sub-groups; a collective over `world`.
ParallelLayout make_parallel_layout(std::shared_ptr<ProcessGroup> world, std::int64_t ep, const ModelConfig& c);

// Points every MoE layer of `model` (built with layout.placement()) at the
// layout: router statistics over the world, rows over the expert-parallel
// group. `reuse_routing_metadata`: replays reuse the forward's counts.
void apply_parallel_layout(DecoderModel& model, const ParallelLayout& layout, bool reuse_routing_metadata);

// This rank's consecutive 1/size of a global batch (dim 0 must divide by
// the group's size; the batch itself in one process).
Tensor batch_shard(const Tensor& global, const ProcessGroup& group);

// True for the parameters of routed experts ("...mlp.experts.<e>..." or
// Mixtral's "...block_sparse_moe.experts.<e>...": models/moe_layer.h).
bool is_expert_parameter(const std::string& name);

// The gradient reducer of a data-parallel run: routed experts summed over
// their replicas (after backward: their readiness differs by rank), every
// other parameter over the world in buckets started during backward. Null
// in one process.
std::unique_ptr<GradReducer> make_grad_reducer(const ParallelLayout& layout,
                                               const std::vector<std::pair<std::string, Tensor>>& params,
                                               std::int64_t bucket_bytes);

}  // namespace remat
