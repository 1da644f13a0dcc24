// The Llama-style decoder of docs/REFERENCE.md#models-and-configs: token
// embedding, pre-norm blocks (RMSNorm, rotary causal attention, residual,
// RMSNorm, SwiGLU MLP or MoE, residual), final RMSNorm and an LM head (untied,
// or the embedding's weight with ModelConfig::tie_embeddings); loss = mean
// cross-entropy over all positions. Parameter names follow Hugging Face Llama /
// Qwen2(-MoE) / Mixtral (ModelConfig::arch).
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "models/block_stack.h"
#include "models/config.h"
#include "models/layers.h"
#include "models/module.h"
#include "models/moe_layer.h"

namespace remat {

// A decoder block is a Block (models/block_stack.h): it offers the
// sub-regions "attention", "core_attn" (in self_attn), "layernorm", "mlp",
// and in MoE blocks "moe", "moe_expert", "shared_experts" (in the MoE layer)
// and "moe_act" (the experts' activation, output-discarded).
class DecoderBlock : public Block {
 public:
  DecoderBlock(const ModelConfig& c, std::int64_t layer, Generator& gen, ExpertPlacement placement = {});
  // x [B, S, d] -> [B, S, d].
  Tensor forward(const Tensor& x) const override;
  std::vector<std::string> sub_regions() const override;
  // Also makes the experts discard their activation when "moe_act" is named.
  void set_regions(const std::set<std::string>& names) override;
  // An MoE block's router losses (MoETerms) leave it beside its output.
  std::string side_outputs() const override;
  // Incremental decoding (no grad, no dropout, no recompute plan): the
  // block on the positions after those cached in k_cache / v_cache, which it
  // extends (SelfAttention::forward_cached).
  Tensor forward_cached(const Tensor& x, Tensor& k_cache, Tensor& v_cache) const;
  // The attention half and the MLP half (each includes its residual).
  Tensor attention_part(const Tensor& x) const;
  Tensor mlp_part(const Tensor& h) const;

  std::shared_ptr<RMSNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<SelfAttention> self_attn;
  std::shared_ptr<MLP> mlp;      // dense blocks
  std::shared_ptr<MoELayer> moe; // MoE blocks (registered as "mlp" too)
  double dropout;
  // Tensor parallel (models/tensor_parallel.h): under sequence parallelism
  // the block's input and output are this rank's part of the sequence, and
  // dropout draws one process's values for it.
  std::shared_ptr<const TensorParallel> tp;

 private:
  Tensor drop(const Tensor& y) const;  // the dropout of an attention or MLP output
  // The MLP or MoE block on the post-attention norm's output n, inside the
  // "mlp" region. Under sequence parallelism a MoE block runs on the whole
  // sequence on every rank (its router statistics and capacity need every
  // token), gathered in and split out inside the region.
  Tensor feed_forward(const Tensor& n) const;
};

// "model": the embedding, the blocks and the final norm.
class DecoderStack : public Module {
 public:
  DecoderStack(const ModelConfig& c, Generator& gen, ExpertPlacement placement = {});
  std::shared_ptr<Embedding> embed_tokens;
  // The blocks as a BlockStack registered as "layers" (blocks "0", "1", ...:
  // "model.layers.N...."); recompute plans are set on it.
  std::shared_ptr<BlockStack> blocks;
  std::vector<std::shared_ptr<DecoderBlock>> layers;  // the same blocks, typed
  std::shared_ptr<RMSNorm> norm;
};

// The chunked loss's default chunk: the f32 logits of a chunk of about
// kLossChunkBytes, rounded down to a multiple of loss_chunk_tile(device) (at
// least one tile), so the weight's gradient has the unchunked bits.
inline constexpr std::int64_t kLossChunkBytes = std::int64_t(16) << 20;
std::int64_t default_loss_chunk(std::int64_t vocab, Device device);

// "f32", "bf16" or "f16" -> the dtype (for --dtype); throws Error otherwise.
DType compute_dtype_from_name(const std::string& name);

// The keys and values of every layer for the positions decoded so far.
struct KVCache {
  std::vector<Tensor> k, v;  // per layer [B, H, T, Dh] (undefined before the first call)
  std::int64_t length() const { return k.empty() || !k[0].defined() ? 0 : k[0].size(2); }
};

class DecoderModel : public Module {
 public:
  // Parameters initialised from a Generator seeded with `seed`, in name order.
  // Under expert parallelism this rank holds only the routed experts of
  // `placement` (with the same values one process would give them).
  DecoderModel(const ModelConfig& c, std::uint64_t seed, ExpertPlacement placement = {});

  struct Output {
    Tensor ce;      // mean cross-entropy (0-dim)
    Tensor aux;     // sum over MoE layers of the load-balancing loss (0-dim; 0 when dense)
    Tensor loss;    // ce + aux_coef * aux
    // The MoE layers' routing metrics (forward_loss: one per MoE layer, in
    // layer order; empty when dense).
    std::vector<MoELayerStats> routing;
  };
  // tokens [B, S + 1] (i64): inputs tokens[:, :S], targets tokens[:, 1:].
  Output forward_loss(const Tensor& tokens) const;
  // input_ids [B, S] -> logits [B, S, vocab].
  Tensor forward(const Tensor& input_ids) const;
  // The hidden states after the embedding: input_ids [B, S] -> [B, S, d].
  Tensor embed(const Tensor& input_ids) const;
  // Runs every block under the recompute plan set on model->blocks.
  Tensor run_blocks(const Tensor& x) const;
  // Pipeline stages: blocks [begin, end) only, under the same plan; their
  // MoE layers' loss terms and metrics are appended to `terms`.
  Tensor run_blocks(const Tensor& x, std::int64_t begin, std::int64_t end, MoETerms& terms) const;
  // The Output of cross-entropy `ce` and the MoE layers' terms (all the
  // model's, in layer order; a pipeline gathers them from its stages):
  // loss = ce + aux_coef * (aux_0 + aux_1 + ...) + z_coef * z_0 + ..., the
  // operations forward_loss runs, so the same bits.
  Output combine_loss(const Tensor& ce, const std::vector<Tensor>& aux, const std::vector<Tensor>& z) const;
  // Final norm and LM head: [B, S, d] -> logits.
  Tensor head(const Tensor& x) const;
  // The mean cross-entropy of the last block's output x [B, S, d] against
  // targets [B, S]: the final norm, the LM head and the loss, as one
  // linear_cross_entropy in chunks of loss_chunk() tokens under the plan's
  // chunked_loss or without grad (eval: the same bits at any chunk), else
  // cross_entropy(head(x)). Allocations in MemoryCategory::loss.
  Tensor loss_head(const Tensor& x, const Tensor& targets) const;
  // Tokens per chunk of the chunked loss for a batch of `tokens` positions:
  // the plan's chunked_loss:N (ShapeError if N > tokens), else
  // default_loss_chunk() (at most tokens).
  std::int64_t loss_chunk(std::int64_t tokens) const;
  // The LM head's weight [vocab, d]: lm_head's, or the embedding's when tied.
  const Tensor& output_weight() const;
  // The parameters some op reads as f32 values rather than through
  // weight_as (the embedding table, the MoE routers' weights), by name:
  // ZeRO-3 gathers their units in f32, the others' in the compute dtype.
  std::set<std::string> f32_read_parameters() const;
  // Generation: logits [B, S, vocab] of input_ids [B, S] at the positions
  // after the cache's, extending the cache (runs without grad); with
  // last_only, those of the last position only [B, 1, vocab]. Prefill with
  // the prompt, then feed one token at a time.
  Tensor forward_cached(const Tensor& input_ids, KVCache& cache, bool last_only = false) const;

  const ModelConfig& config() const { return config_; }
  // Mixed precision: activations and compute in `dtype` (bf16, f16 or f32,
  // the default), parameters and the loss in f32.
  void set_compute_dtype(DType dtype);
  DType compute_dtype() const { return compute_dtype_; }

  std::shared_ptr<DecoderStack> model;
  std::shared_ptr<Linear> lm_head;  // null when the embeddings are tied

  // Tensor parallel (models/tensor_parallel.h): this rank holds rows
  // [vocab_begin(), vocab_begin() + V/T) of the embedding and the LM head;
  // the loss is vocab_parallel_cross_entropy, forward()'s logits gathered.
  void set_tensor_parallel(std::shared_ptr<const TensorParallel> tp, std::int64_t vocab_begin);
  const std::shared_ptr<const TensorParallel>& tensor_parallel() const { return tp_; }
  std::int64_t vocab_begin() const { return vocab_begin_; }

 private:
  ModelConfig config_;
  DType compute_dtype_ = DType::f32;
  std::shared_ptr<const TensorParallel> tp_;
  std::int64_t vocab_begin_ = 0;
  Tensor tp_loss_head(const Tensor& x, const Tensor& targets) const;  // the vocabulary-parallel loss

 public:
  // The blocks' stack (model->blocks): its recompute plan and the plan's
  // offload and compression hooks, for those that read them without
  // reaching through the module tree.
  const BlockStack& block_stack() const { return *model->blocks; }
};

}  // namespace remat
