// The building blocks of the decoder: Linear (no bias, [out, in] weight),
// Embedding, RMSNorm, rotary causal self-attention and the SwiGLU MLP.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "engine/rng.h"
#include "models/config.h"
#include "models/module.h"
#include "parallel/tensor_parallel_ops.h"

namespace remat {

// Runs the named parts of a block (attention's core, the MoE layer's parts):
// as a checkpoint region, under saved-tensor hooks or directly, as the
// recompute plan says. A Block owns the one for its parts
// (Block::part_runner(), models/block_stack.h) and hands it by reference to
// the forward of the child modules that run parts.
class PartRunner {
 public:
  virtual ~PartRunner() = default;
  // fn(inputs) run as part `part`; returns its outputs.
  virtual std::vector<Tensor> run(const std::string& part, const RegionFn& fn,
                                  const std::vector<Tensor>& inputs) const = 0;
  // Runs every part directly (no plan: generation, a layer on its own).
  static const PartRunner& direct();
};

// Mixed precision: parameters stay f32 (the master weights); a layer given
// bf16 (or f16) input computes in that dtype with a differentiable cast of
// its weight, so gradients reach the f32 parameter.
// While `weight` has a gathered copy in the input's dtype (below), that
// copy is returned instead of a fresh cast, with the same gradient.
Tensor weight_as(const Tensor& weight, const Tensor& input);

// ZeRO-3 gathers a unit's parameters in the compute dtype (train/zero_gather.h):
// the f32 parameter keeps no values, and `copy` (its shape, bf16 or f16: the
// bits casting its f32 values gives) is what weight_as hands the layers until
// cleared. Thread-safe; the caller keeps the pair consistent.
void set_gathered_copy(const Tensor& param, const Tensor& copy);
void clear_gathered_copy(const Tensor& param);

// RAII: while one is alive on this thread, new layers allocate their
// weights without drawing them (values unspecified; `gen` is not advanced),
// for models whose every parameter is loaded right after (a Hugging Face
// folder, a saved state): drawing a billion normals costs as much as the load.
class SkipWeightInit {
 public:
  SkipWeightInit();
  ~SkipWeightInit();
  SkipWeightInit(const SkipWeightInit&) = delete;
  SkipWeightInit& operator=(const SkipWeightInit&) = delete;

 private:
  bool previous_;
};

// How a parameter's initial values are made, so that any range of them can
// be made alone, equal to the whole draw's (under --zero 3 each rank makes
// only its shards: train/zero.h): `std` times the standard normals of the
// draw at `state` (element i: word i % 4 of Philox block i / 4,
// engine/philox.h), or zeros, or ones.
struct InitRecipe {
  enum class Kind { normal, zeros, ones };
  Kind kind = Kind::zeros;
  RngState state;
  double std = 1.0;
};
// Elements [begin, begin + out.numel()) of the flattened initial values
// into `out` (contiguous f32 on the CPU).
void fill_init_range(const InitRecipe& recipe, std::int64_t begin, Tensor& out);

// RAII: while one is alive on this thread, layers built on the meta device
// (DefaultDeviceScope) record each parameter's recipe and advance `gen` as
// drawing the values would (so a later build continues the same stream),
// drawing nothing.
class InitRecorder {
 public:
  InitRecorder();
  ~InitRecorder();
  InitRecorder(const InitRecorder&) = delete;
  InitRecorder& operator=(const InitRecorder&) = delete;
  // The recipe of parameter `p` (the same tensor, by identity); Error if
  // none was recorded.
  const InitRecipe& recipe(const Tensor& p) const;
  // The recorder alive on this thread (null: none).
  static InitRecorder* current();
  void record(const Tensor& p, const InitRecipe& r) { recipes_[p.impl_ptr().get()] = r; }

 private:
  std::map<const void*, InitRecipe> recipes_;
  InitRecorder* previous_;
};

// Parameters start as normal(0, std) from `gen` (weights; see SkipWeightInit),
// zeros (biases) or ones (norms), in allocation category `parameter`.
class Linear : public Module {
 public:
  // With `bias`, a parameter "bias" [out] (zeros; draws nothing from `gen`).
  Linear(std::int64_t in, std::int64_t out, double init_std, Generator& gen, bool bias = false);
  // x [..., in] -> [..., out] (x W^T + b, plus the LoRA term with an adapter).
  Tensor forward(const Tensor& x) const;
  // Adds a LoRA adapter (models/lora.h): parameters "lora_A.weight" [r, in]
  // (U(-1/sqrt(in), 1/sqrt(in)) from Philox stream `draw`; no values on the
  // meta device) and "lora_B.weight" [out, r] (zeros). Error if it has one.
  void add_lora(std::int64_t r, double alpha, double dropout, RngState draw);
  bool has_lora() const { return lora_A.defined(); }
  Tensor weight;
  Tensor bias;  // undefined without a bias
  Tensor lora_A, lora_B;  // undefined without an adapter
  double lora_scaling = 0, lora_dropout = 0;
  // False where the model reads the weight other than through forward()
  // (the MoE router, the LM head), so an adapter there would be ignored.
  bool adaptable = true;
};

class Embedding : public Module {
 public:
  Embedding(std::int64_t vocab, std::int64_t dim, double init_std, Generator& gen);
  // ids [...] (i64) -> [..., dim].
  Tensor forward(const Tensor& ids) const;
  Tensor weight;
};

class RMSNorm : public Module {
 public:
  RMSNorm(std::int64_t dim, double eps);
  // x * rsqrt(mean(x^2) + eps) * weight over the last dim.
  Tensor forward(const Tensor& x) const;
  // The weight as forward uses it on x (x's dtype; under sequence
  // parallelism through tp->replicated).
  Tensor weight_for(const Tensor& x) const;
  Tensor weight;
  double eps;
  std::shared_ptr<const TensorParallel> tp;  // set by apply_tensor_parallel (models/tensor_parallel.h)
};

// Multi-head causal self-attention with rotary position embeddings:
// q_proj [H * Dh, d], k_proj / v_proj [Hkv * Dh, d] (grouped-query when Hkv <
// H: each key/value head serves H / Hkv consecutive query heads), o_proj
// [d, H * Dh]; optional q/k/v and o biases (ModelConfig).
class SelfAttention : public Module {
 public:
  SelfAttention(const ModelConfig& c, Generator& gen);
  // x [B, S, d] -> [B, S, d] (before dropout and the residual); the core
  // runs as part "core_attn" through `parts`.
  Tensor forward(const Tensor& x, const PartRunner& parts = PartRunner::direct()) const;
  // The core: q [B, H, S, Dh], k, v [B, Hkv, S, Dh] -> [B, S, H * Dh]
  // (rotary, fused attention, merge heads).
  Tensor core(const Tensor& q, const Tensor& k, const Tensor& v) const;
  // Incremental decoding (call under NoGradGuard): x [B, S, d] holds the
  // positions that follow the k_cache.size(2) cached ones (0 when the caches
  // are undefined). Appends the new rotated keys and the values to the caches
  // ([B, H, T, Dh]) and attends over all of them, causally among the new
  // positions. The same function as forward() on the whole sequence, up to
  // rounding (the cached path is a matmul / softmax, not the fused kernel).
  Tensor forward_cached(const Tensor& x, Tensor& k_cache, Tensor& v_cache) const;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;
  std::int64_t n_heads, n_kv_heads, head_dim;  // this rank's heads under tensor parallelism
  double rope_theta;
  // Tensor parallel (models/tensor_parallel.h): q/k/v column-parallel by
  // heads, o_proj row-parallel (its bias added once, after the reduction);
  // under sequence parallelism q/k/v are one sp_column_linears, which keeps
  // this rank's piece of the input for backward, not the gathered sequence.
  std::shared_ptr<const TensorParallel> tp;

 private:
  Tensor project_kv(const Linear& proj, const Tensor& x) const;  // k_proj / v_proj, shared by ranks or not
  // From q [B, H, S, Dh], k and v [B, Hkv, S, Dh]: the core (part
  // "core_attn") and the output projection.
  Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, const PartRunner& parts) const;
};

// The parameter names of an MLP's three projections: {gate, up, down}.
struct MLPNames {
  std::string gate = "gate_proj", up = "up_proj", down = "down_proj";
  static MLPNames mixtral() { return {"w1", "w3", "w2"}; }  // Mixtral's block_sparse_moe experts
};

// SwiGLU MLP: down(silu(gate(x)) * up(x)).
class MLP : public Module {
 public:
  // Weights drawn gate, up, down from `gen`, registered under `names`.
  MLP(std::int64_t d_model, std::int64_t hidden, double init_std, Generator& gen, const MLPNames& names = {});
  Tensor forward(const Tensor& x) const;
  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
  // Drop the activation output after the forward and regenerate it (from the
  // gate and up outputs, which its backward keeps anyway) right before the
  // down projection's backward: an output-discard checkpoint ("moe_act").
  bool recompute_activation = false;
  // Tensor parallel: gate/up column-parallel, down row-parallel (a dense
  // block's MLP; models/tensor_parallel.h).
  std::shared_ptr<const TensorParallel> tp;

 private:
  Tensor down(Tensor g, Tensor u) const;  // down(swiglu(g, u)), this rank's part; lets go of g and u first
};

}  // namespace remat
