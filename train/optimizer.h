// AdamW (decoupled weight decay, bias correction, f32 state), gradient
// clipping by global norm, and the cosine learning-rate schedule with linear
// warm-up.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace remat {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  // applied to the tensors with decay (by default: 2 or more dims)
};

// A tensor AdamW updates: a parameter, or a piece of one (a flat view of a
// rank's shard under ZeRO), with whether weight decay applies to it.
struct AdamWParam {
  AdamWParam(std::string n, Tensor p, bool d) : name(std::move(n)), param(std::move(p)), decay(d) {}
  // With the state's storage given: `m` and `v` are zeroed contiguous f32
  // tensors of the parameter's element count on its device (views into one
  // buffer per ZeRO unit, so every rank allocates the same blocks).
  AdamWParam(std::string n, Tensor p, bool d, Tensor m, Tensor v)
      : name(std::move(n)), param(std::move(p)), decay(d), exp_avg(std::move(m)), exp_avg_sq(std::move(v)) {}
  std::string name;  // keys the saved state
  Tensor param;      // contiguous f32; the update reads param.grad()
  bool decay;
  Tensor exp_avg, exp_avg_sq;  // undefined: AdamW allocates them
};

class AdamW {
 public:
  // Takes the parameters by name (the names key the saved state); each must
  // be a contiguous f32 CPU or CUDA tensor. Weight decay applies to those
  // with 2 or more dims.
  AdamW(std::vector<std::pair<std::string, Tensor>> params, AdamWOptions opts = {});
  // The same with the decay chosen per tensor.
  AdamW(std::vector<AdamWParam> params, AdamWOptions opts);

  // One update with learning rate `lr` from each parameter's .grad (a
  // parameter without a gradient is left alone). Runs without autograd.
  // Element by element in f32 with multi_tensor_adamw's operations and order:
  // CPU parameters in one parallel region over fixed chunks of all of them,
  // CUDA parameters in one launch per device; the result does not depend on
  // the thread count.
  void step(double lr);
  std::int64_t steps() const { return step_; }

  // The state as named tensors ("optimizer.exp_avg.<name>",
  // "optimizer.exp_avg_sq.<name>") for saving.
  std::vector<std::pair<std::string, Tensor>> state() const;
  // Restores state saved by state(); throws IOError naming any missing or
  // mismatched tensor (and changes nothing in that case).
  void load_state(const std::map<std::string, Tensor>& tensors, std::int64_t step);
  // Fills every state tensor in place, fill(prefix, name, dst) with prefix
  // "optimizer.exp_avg." or "optimizer.exp_avg_sq." and the parameter's
  // name (dst: contiguous f32, the parameter's shape and device), then sets
  // the step count. The caller validates first: an exception from `fill`
  // leaves the state partly filled.
  using StateFill = std::function<void(const std::string& prefix, const std::string& name, Tensor& dst)>;
  void fill_state(const StateFill& fill, std::int64_t step);

 private:
  struct Slot {
    std::string name;
    Tensor param, exp_avg, exp_avg_sq;
    bool decay = true;
  };
  std::vector<Slot> slots_;
  AdamWOptions opts_;
  std::int64_t step_ = 0;
};

// The persistent footprint of training: the parameters, a gradient buffer
// per parameter that requires grad, and the optimizer's state.
std::int64_t persistent_bytes(const std::vector<std::pair<std::string, Tensor>>& params, const AdamW& opt);

// A zero gradient (category gradient) for each tensor without one. Before
// the first step it places the gradient buffers ahead of any activation,
// each in space of its own size: left to backward, a buffer would take a
// larger cached block, which the allocator keeps whole when no more than
// CachingAllocator::kMinLargeSplit would remain, for good.
void give_gradient_buffers(const std::vector<Tensor>& params);

// Scales every gradient in place so that their global L2 norm is at most
// max_norm; returns the norm before scaling (grad_sq_sum's, square-rooted).
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);
// The pieces of clip_grad_norm, for norms over parameters split between
// ranks: the sum of squares of the gradients, and the scaling clip_grad_norm
// applies for a given norm.
// grad_sq_sum is deterministic and independent of the thread count: CPU
// gradients (in order) are cut into fixed chunks of 16384 elements, each
// chunk summed in double over 16 fixed lanes combined pairwise, the chunk
// partials added in order; then each CUDA device's sum (multi_tensor_sum_squares).
double grad_sq_sum(const std::vector<Tensor>& params);
// The chunk partials grad_sq_sum adds in order (CPU gradients only, else
// DeviceError): a pipeline stage's partials, concatenated in stage order and
// added in order, give one process's sum bit for bit.
std::vector<double> grad_sq_partials(const std::vector<Tensor>& params);
void clip_grads_to(const std::vector<Tensor>& params, double norm, double max_norm);
// Multiplies every gradient by `factor` in place (x *= factor in f32; every
// gradient must be contiguous f32, else DTypeError before anything changes),
// e.g. 1 / loss scale; a power of two is exact.
void scale_grads(const std::vector<Tensor>& params, float factor);

// Linear warm-up from 0 to max_lr over `warmup` steps, then cosine decay to
// min_lr at `total` steps (constant after). `step` counts from 0.
double cosine_lr(std::int64_t step, std::int64_t warmup, std::int64_t total, double max_lr, double min_lr);
// The learning-rate schedule after the warm-up (TrainOptions::schedule).
enum class LrSchedule {
  cosine,    // cosine_lr: to min_lr at `total`
  linear,    // the same warm-up, then a straight line from max_lr to min_lr at `total`
  constant,  // the warm-up, then max_lr
};
// "cosine", "linear" or "constant"; Error naming TrainOptions.schedule (--schedule) and the value otherwise.
LrSchedule parse_lr_schedule(const std::string& name);
const char* lr_schedule_name(LrSchedule s);
// The learning rate of `schedule` at `step` (from 0), after `warmup` steps of linear warm-up.
double schedule_lr(LrSchedule schedule, std::int64_t step, std::int64_t warmup, std::int64_t total, double max_lr,
                   double min_lr);

}  // namespace remat
