#include "models/decoder.h"

#include "ops/norm.h"

#include "ops/dropout.h"
#include "engine/allocator.h"
#include "ops/linear_cross_entropy.h"
#include "ops/loss.h"
#include "ops/ops.h"
#include "parallel/vocab_parallel.h"

namespace remat {

DecoderBlock::DecoderBlock(const ModelConfig& c, std::int64_t layer, Generator& gen, ExpertPlacement placement)
    : dropout(c.dropout) {
  input_layernorm = register_module("input_layernorm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps));
  self_attn = register_module("self_attn", std::make_shared<SelfAttention>(c, gen));
  post_attention_layernorm =
      register_module("post_attention_layernorm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps));
  if (c.is_moe_layer(layer))
    moe = register_module(c.arch == "mixtral" ? "block_sparse_moe" : "mlp",
                          std::make_shared<MoELayer>(c, layer, gen, placement));
  else
    mlp = register_module("mlp", std::make_shared<MLP>(c.d_model, c.ffn, c.init_std, gen));
}

std::vector<std::string> DecoderBlock::sub_regions() const {
  std::vector<std::string> names = {"attention", "core_attn", "layernorm", "mlp"};
  if (moe) names.insert(names.end(), {"moe", "moe_act", "moe_expert", "shared_experts"});
  return names;
}

std::string DecoderBlock::side_outputs() const {
  return moe ? "its router's aux and z losses (which the model adds to the loss)" : "";
}

void DecoderBlock::set_regions(const std::set<std::string>& names) {
  Block::set_regions(names);
  if (moe)
    for (auto& e : moe->experts) e->recompute_activation = names.count("moe_act") > 0;
}

namespace {
RegionFn norm_fn(const RMSNorm& norm) {
  return [&norm](const std::vector<Tensor>& in) { return std::vector<Tensor>{norm.forward(in[0])}; };
}
}  // namespace

Tensor DecoderBlock::drop(const Tensor& y) const {
  if (!tp || !tp->sp) return remat::dropout(y, dropout, training());
  return remat::dropout(y, dropout, training(), RowPiece{tp->rank(), tp->size()});  // [B, S/T, d] of [B, S, d]
}

Tensor DecoderBlock::feed_forward(const Tensor& n) const {
  if (!moe) return mlp->forward(n);
  if (!tp) return moe->forward(n, part_runner());
  return tp->own_part(moe->forward(tp->whole(n), part_runner()));
}

Tensor DecoderBlock::attention_part(const Tensor& x) const {
  return region("attention", [this](const std::vector<Tensor>& in) {
    Tensor a = self_attn->forward(region("layernorm", norm_fn(*input_layernorm), {in[0]})[0], part_runner());
    return std::vector<Tensor>{add(in[0], drop(a))};
  }, {x})[0];
}

Tensor DecoderBlock::mlp_part(const Tensor& h) const {
  Tensor n = region("layernorm", norm_fn(*post_attention_layernorm), {h})[0];
  Tensor m = region("mlp", [this](const std::vector<Tensor>& in) { return std::vector<Tensor>{feed_forward(in[0])}; },
                    {n})[0];
  return add(h, drop(m));
}

Tensor DecoderBlock::forward(const Tensor& x) const {
  if (part_wrapped("attention") || part_wrapped("layernorm")) return mlp_part(attention_part(x));
  // The attention's residual add and the MLP's norm as one pass
  // (add_rms_norm: the same bits as add then rms_norm, and the same
  // gradients, h having one other consumer, the MLP's residual add).
  Tensor a = drop(self_attn->forward(input_layernorm->forward(x), part_runner()));
  const RMSNorm& pn = *post_attention_layernorm;
  auto [h, n] = add_rms_norm(x, a, pn.weight_for(x), pn.eps);
  Tensor m = region("mlp", [this](const std::vector<Tensor>& in) { return std::vector<Tensor>{feed_forward(in[0])}; },
                    {n})[0];
  return add(h, drop(m));
}

Tensor DecoderBlock::forward_cached(const Tensor& x, Tensor& k_cache, Tensor& v_cache) const {
  Tensor h = add(x, self_attn->forward_cached(input_layernorm->forward(x), k_cache, v_cache));
  Tensor n = post_attention_layernorm->forward(h);
  return add(h, moe ? moe->forward(n) : mlp->forward(n));
}

DecoderStack::DecoderStack(const ModelConfig& c, Generator& gen, ExpertPlacement placement) {
  embed_tokens = register_module("embed_tokens", std::make_shared<Embedding>(c.vocab, c.d_model, c.init_std, gen));
  blocks = register_module("layers", std::make_shared<BlockStack>());
  for (std::int64_t i = 0; i < c.n_layers; ++i)
    layers.push_back(blocks->add_block(std::to_string(i), std::make_shared<DecoderBlock>(c, i, gen, placement)));
  norm = register_module("norm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps));
}

DecoderModel::DecoderModel(const ModelConfig& c, std::uint64_t seed, ExpertPlacement placement) : config_(c) {
  c.validate();
  Generator gen(seed);
  model = register_module("model", std::make_shared<DecoderStack>(c, gen, placement));
  model->blocks->set_has_lm_head(true);
  model->blocks->set_side_outputs(moe_terms_channel());  // reentrant regions over MoE blocks return the router losses
  if (!c.tie_embeddings) {
    lm_head = register_module("lm_head", std::make_shared<Linear>(c.d_model, c.vocab, c.init_std, gen));
    lm_head->adaptable = false;  // (the chunked loss and tensor parallelism read its weight)
  }
  if (c.lora.enabled()) apply_lora(*this, c.lora, seed);
  if (!c.freeze.empty()) freeze_parameters(*this, c.freeze);
}

DType compute_dtype_from_name(const std::string& name) {
  if (name == "f32") return DType::f32;
  if (name == "bf16") return DType::bf16;
  if (name == "f16") return DType::f16;
  throw Error("--dtype '" + name + "': expected f32, bf16 (mixed precision: f32 master weights and loss) or f16");
}

void DecoderModel::set_compute_dtype(DType dtype) {
  REMAT_CHECK(is_floating(dtype) && dtype != DType::fp8_e4m3, DTypeError,
              "DecoderModel: compute dtype must be f32, bf16 or f16, got ", dtype);
  compute_dtype_ = dtype;
}

void DecoderModel::set_tensor_parallel(std::shared_ptr<const TensorParallel> tp, std::int64_t vocab_begin) {
  tp_ = std::move(tp);
  vocab_begin_ = vocab_begin;
}

Tensor DecoderModel::embed(const Tensor& input_ids) const {
  UnitRun unit(model->blocks->unit_hooks(), "embed");
  Tensor h;
  if (tp_) {  // each rank looks up its rows; the sum (under sp: this rank's part of the sequence) is the lookup
    const Tensor part = vocab_parallel_embedding(model->embed_tokens->weight, input_ids, vocab_begin_);
    h = unit.done(tp_->sp ? tp_scatter(tp_->group, part, 1) : tp_reduce(tp_->group, part));
  } else {
    h = unit.done(model->embed_tokens->forward(input_ids));
  }
  return h.dtype() == compute_dtype_ ? h : cast(h, compute_dtype_);
}

Tensor DecoderModel::run_blocks(const Tensor& x) const { return model->blocks->forward(x); }

Tensor DecoderModel::run_blocks(const Tensor& x, std::int64_t begin, std::int64_t end, MoETerms& terms) const {
  MoETermsScope collect(terms);
  return model->blocks->forward(x, begin, end);
}

DecoderModel::Output DecoderModel::combine_loss(const Tensor& ce, const std::vector<Tensor>& aux,
                                                const std::vector<Tensor>& z) const {
  Output out;
  out.ce = ce;
  out.loss = ce;
  if (aux.empty()) {
    out.aux = zeros({}, ce.device());
  } else {
    out.aux = aux[0];
    for (std::size_t i = 1; i < aux.size(); ++i) out.aux = add(out.aux, aux[i]);
    out.loss = add(out.loss, mul(out.aux, config_.aux_coef));
  }
  for (const Tensor& t : z) out.loss = add(out.loss, mul(t, config_.z_coef));
  return out;
}

const Tensor& DecoderModel::output_weight() const {
  return lm_head ? lm_head->weight : model->embed_tokens->weight;
}

std::set<std::string> DecoderModel::f32_read_parameters() const {
  std::set<const TensorImpl*> direct = {&model->embed_tokens->weight.impl()};
  for (const auto& layer : model->layers)
    if (layer && layer->moe) direct.insert(&layer->moe->gate->weight.impl());
  std::set<std::string> names;
  for (const auto& [name, p] : named_parameters())
    if (direct.count(&p.impl())) names.insert(name);
  return names;
}

Tensor DecoderModel::head(const Tensor& x) const {
  UnitRun unit(model->blocks->unit_hooks(), "head");
  const Tensor n = tp_ ? tp_->enter(model->norm->forward(x)) : model->norm->forward(x);
  Tensor logits = lm_head ? lm_head->forward(n) : linear(n, weight_as(model->embed_tokens->weight, n));
  if (tp_) logits = tp_gather(tp_->group, logits, logits.dim() - 1);  // every rank's rows of the vocabulary
  return unit.done(logits.dtype() == DType::f32 ? logits : cast(logits, DType::f32));  // the loss in f32
}

std::int64_t default_loss_chunk(std::int64_t vocab, Device device) {
  const std::int64_t tile = loss_chunk_tile(device);
  const std::int64_t rows = std::max<std::int64_t>(1, kLossChunkBytes / (std::max<std::int64_t>(vocab, 1) * 4));
  return std::max(tile, rows / tile * tile);
}

std::int64_t DecoderModel::loss_chunk(std::int64_t tokens) const {
  const RecomputePlan& plan = block_stack().plan();
  if (plan.chunked_loss && plan.loss_chunk > 0) {
    REMAT_CHECK(plan.loss_chunk <= tokens, ShapeError, "--recompute ", plan.spec, ": chunks of ", plan.loss_chunk,
                " tokens, but the loss sees ", tokens, " at a time (a micro-batch's sequences x seq); expected at most ",
                tokens);
    return plan.loss_chunk;
  }
  return std::min(default_loss_chunk(config_.vocab, output_weight().device()), std::max<std::int64_t>(tokens, 1));
}

Tensor DecoderModel::tp_loss_head(const Tensor& x, const Tensor& targets) const {
  UnitRun unit(model->blocks->unit_hooks(), "head");
  const Tensor n = tp_->enter(model->norm->forward(x));  // the whole sequence on every rank
  const Tensor w = weight_as(output_weight(), n);
  REMAT_CHECK(!lm_head || !lm_head->bias.defined(), Error, "tensor parallel: the LM head has a bias, which the "
              "vocabulary-parallel loss does not take");
  const bool chunked = block_stack().plan().chunked_loss || !grad_enabled();
  const std::int64_t chunk = chunked ? loss_chunk(targets.numel()) : std::max<std::int64_t>(targets.numel(), 1);
  return unit.done(vocab_parallel_cross_entropy(tp_->group, n, w, targets, vocab_begin_, config_.vocab, chunk));
}

Tensor DecoderModel::loss_head(const Tensor& x, const Tensor& targets) const {
  if (tp_) {
    CategoryScope cat(MemoryCategory::loss);
    return tp_loss_head(x, targets);
  }
  // Chunked under the plan's chunked_loss, and always without grad (eval):
  // the loss has the same bits at any chunk, only the weight's gradient
  // depends on it.
  CategoryScope cat(MemoryCategory::loss);  // its logits apart from the blocks' activations
  if (!block_stack().plan().chunked_loss && grad_enabled()) return cross_entropy(head(x), targets);
  UnitRun unit(model->blocks->unit_hooks(), "head");
  const Tensor n = model->norm->forward(x);
  const Tensor w = lm_head ? weight_as(lm_head->weight, n) : weight_as(model->embed_tokens->weight, n);
  REMAT_CHECK(!lm_head || !lm_head->bias.defined(), Error, "chunked_loss: the LM head has a bias, which the chunked "
              "loss does not take");
  return unit.done(linear_cross_entropy(n, w, targets, loss_chunk(targets.numel())));
}

Tensor DecoderModel::forward(const Tensor& input_ids) const {
  REMAT_CHECK(input_ids.dim() == 2, ShapeError, "DecoderModel: input_ids must be [batch, seq], got ",
              shape_str(input_ids.sizes()));
  BlockStack::SaveHooksScope save_hooks(*model->blocks);  // the plan's offload/compression, head included
  return head(run_blocks(embed(input_ids)));
}

Tensor DecoderModel::forward_cached(const Tensor& input_ids, KVCache& cache, bool last_only) const {
  REMAT_CHECK(input_ids.dim() == 2, ShapeError, "DecoderModel::forward_cached: input_ids must be [batch, seq], got ",
              shape_str(input_ids.sizes()));
  NoGradGuard no_grad;
  const std::size_t L = model->layers.size();
  if (cache.k.empty()) {
    cache.k.resize(L);
    cache.v.resize(L);
  }
  REMAT_CHECK(cache.k.size() == L, Error, "DecoderModel::forward_cached: the cache has ", cache.k.size(),
              " layers, the model ", L);
  Tensor x = embed(input_ids);
  for (std::size_t i = 0; i < L; ++i) x = model->layers[i]->forward_cached(x, cache.k[i], cache.v[i]);
  return head(last_only ? x.narrow(1, x.size(1) - 1, 1) : x);
}

DecoderModel::Output DecoderModel::forward_loss(const Tensor& tokens) const {
  REMAT_CHECK(tokens.dim() == 2 && tokens.size(1) >= 2, ShapeError,
              "DecoderModel: tokens must be [batch, seq + 1], got ", shape_str(tokens.sizes()));
  const std::int64_t S = tokens.size(1) - 1;
  Tensor inputs = tokens.narrow(1, 0, S).contiguous();
  Tensor targets = tokens.narrow(1, 1, S).contiguous();
  BlockStack::SaveHooksScope save_hooks(*model->blocks);  // the loss's saves too
  MoETerms terms;
  Tensor x;
  {
    MoETermsScope collect(terms);
    x = run_blocks(embed(inputs));
  }
  Output out = combine_loss(loss_head(x, targets), terms.aux, terms.z);
  out.routing = std::move(terms.stats);
  return out;
}

}  // namespace remat
