#include "models/layers.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "checkpoint/output_discard.h"
#include "engine/allocator.h"
#include "engine/custom_op.h"
#include "engine/grad_mode.h"
#include "engine/recompute_context.h"
#include "ops/attention.h"
#include "ops/embedding.h"
#include "ops/norm.h"
#include "ops/matmul.h"
#include "ops/ops.h"
#include "ops/rotary.h"
#include "ops/swiglu.h"

namespace remat {

namespace {
thread_local bool tls_skip_weight_init = false;
thread_local InitRecorder* tls_init_recorder = nullptr;

Tensor init_normal(const Shape& shape, double std, Generator& gen) {
  CategoryScope cat(MemoryCategory::parameter);
  NoGradGuard ng;
  if (tls_init_recorder && default_device().is_meta()) {  // the recipe, and the stream advanced as by the draw
    Tensor t = empty(shape, DType::f32);
    tls_init_recorder->record(t, {InitRecipe::Kind::normal, gen.reserve(std::uint64_t(shape_numel(shape))), std});
    return t;
  }
  // (A model built under DefaultDeviceScope(meta) draws nothing: same allocation.)
  if (tls_skip_weight_init || default_device().is_meta()) return empty(shape, DType::f32);
  // Drawn and scaled on the host (the same values on every device), then
  // moved to the device the model is built on.
  const Device device = default_device();
  Tensor t;
  {
    DefaultDeviceScope host(kCPU);
    t = randn(shape, DType::f32, &gen);
    if (std != 1.0) {
      float* p = t.data<float>();
      for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = float(double(p[i]) * std);
    }
  }
  return device.is_cpu() ? t : t.to(device);
}

// zeros or ones (`kind`), recorded as such under an InitRecorder.
Tensor init_constant(const Shape& shape, InitRecipe::Kind kind) {
  CategoryScope cat(MemoryCategory::parameter);
  Tensor t = kind == InitRecipe::Kind::ones ? ones(shape) : zeros(shape);
  if (tls_init_recorder) tls_init_recorder->record(t, {kind, {}, 1.0});
  return t;
}
}  // namespace

SkipWeightInit::SkipWeightInit() : previous_(tls_skip_weight_init) { tls_skip_weight_init = true; }
SkipWeightInit::~SkipWeightInit() { tls_skip_weight_init = previous_; }

InitRecorder::InitRecorder() : previous_(tls_init_recorder) { tls_init_recorder = this; }
InitRecorder::~InitRecorder() { tls_init_recorder = previous_; }
InitRecorder* InitRecorder::current() { return tls_init_recorder; }

const InitRecipe& InitRecorder::recipe(const Tensor& p) const {
  auto it = recipes_.find(p.impl_ptr().get());
  REMAT_CHECK(it != recipes_.end(), Error, "InitRecorder: no recipe for a parameter of shape ", shape_str(p.sizes()),
              " (built outside the recorder's scope?)");
  return it->second;
}

void fill_init_range(const InitRecipe& recipe, std::int64_t begin, Tensor& out) {
  REMAT_CHECK(out.is_contiguous() && out.dtype() == DType::f32 && out.device().is_cpu() && begin >= 0, Error,
              "fill_init_range: expected a contiguous f32 CPU tensor and begin >= 0, got ", out.dtype(), " on ",
              out.device(), " from ", begin);
  const std::int64_t n = out.numel();
  float* dst = out.data<float>();
  if (recipe.kind != InitRecipe::Kind::normal) {
    std::fill(dst, dst + n, recipe.kind == InitRecipe::Kind::ones ? 1.0f : 0.0f);
    return;
  }
  // Element i of the draw is word i % 4 of block i / 4: start at begin's block.
  const std::int64_t skip = begin % 4;
  std::vector<float> z(std::size_t(skip + n));
  philox_fill_normal(z.data(), skip + n, {recipe.state.seed, recipe.state.offset + std::uint64_t(begin / 4)});
  for (std::int64_t i = 0; i < n; ++i)
    dst[i] = recipe.std != 1.0 ? float(double(z[std::size_t(skip + i)]) * recipe.std) : z[std::size_t(skip + i)];
}

namespace {
class DirectParts final : public PartRunner {
 public:
  std::vector<Tensor> run(const std::string&, const RegionFn& fn, const std::vector<Tensor>& inputs) const override {
    return fn(inputs);
  }
};
}  // namespace

const PartRunner& PartRunner::direct() {
  static const DirectParts parts;
  return parts;
}

Linear::Linear(std::int64_t in, std::int64_t out, double init_std, Generator& gen, bool with_bias) {
  weight = register_parameter("weight", init_normal({out, in}, init_std, gen));
  if (with_bias) bias = register_parameter("bias", init_constant({out}, InitRecipe::Kind::zeros));
}

namespace {
// Parameters' gathered low-precision copies, by the parameter's identity.
struct GatheredCopies {
  std::mutex mu;
  std::unordered_map<const TensorImpl*, Tensor> copies;
  std::atomic<std::size_t> size{0};  // copies.size(), read without the lock (none outside --zero 3)
};
GatheredCopies& gathered_copies() {
  static GatheredCopies g;
  return g;
}
Tensor gathered_copy(const Tensor& param, DType dtype) {
  GatheredCopies& g = gathered_copies();
  if (g.size.load(std::memory_order_acquire) == 0) return Tensor();  // (no lock: the common case)
  std::lock_guard<std::mutex> lock(g.mu);
  auto it = g.copies.find(&param.impl());
  return it != g.copies.end() && it->second.dtype() == dtype ? it->second : Tensor();
}
// The cast of a parameter whose result the gather made: forward returns the
// copy (input 1), backward casts the gradient back to the parameter's dtype,
// as cast's does. Named "cast" so policies and reports see the op it stands for.
const CustomOp& gathered_cast() {
  static const CustomOp op(
      "cast",
      [](CustomOpContext& ctx, const std::vector<Tensor>& in) {
        ctx.set("dtype", in[0].dtype());
        return std::vector<Tensor>{in[1]};
      },
      [](CustomOpContext& ctx, const std::vector<Tensor>& g) {
        return std::vector<Tensor>{cast(g[0], ctx.get<DType>("dtype")), Tensor()};
      });
  return op;
}
}  // namespace

void set_gathered_copy(const Tensor& param, const Tensor& copy) {
  REMAT_CHECK(copy.sizes() == param.sizes() && (copy.dtype() == DType::bf16 || copy.dtype() == DType::f16), DTypeError,
              "set_gathered_copy: the copy of a ", param.dtype(), " ", shape_str(param.sizes()),
              " parameter must be bf16 or f16 of its shape, got ", copy.dtype(), " ", shape_str(copy.sizes()));
  GatheredCopies& g = gathered_copies();
  std::lock_guard<std::mutex> lock(g.mu);
  g.copies[&param.impl()] = copy;
  g.size.store(g.copies.size(), std::memory_order_release);
}

void clear_gathered_copy(const Tensor& param) {
  GatheredCopies& g = gathered_copies();
  std::lock_guard<std::mutex> lock(g.mu);
  g.copies.erase(&param.impl());
  g.size.store(g.copies.size(), std::memory_order_release);
}

Tensor weight_as(const Tensor& weight, const Tensor& input) {
  if (weight.dtype() == input.dtype()) return weight;
  if (Tensor copy = gathered_copy(weight, input.dtype()); copy.defined()) return gathered_cast().apply1({weight, copy});
  return cast(weight, input.dtype());
}

Tensor Linear::forward(const Tensor& x) const {
  Tensor y = bias.defined() ? linear(x, weight_as(weight, x), weight_as(bias, x)) : linear(x, weight_as(weight, x));
  if (!has_lora()) return y;
  // PEFT's order: result + lora_B(lora_A(dropout(x))) * scaling.
  const Tensor a = linear(remat::dropout(x, lora_dropout, training()), weight_as(lora_A, x));
  return add(y, mul(linear(a, weight_as(lora_B, x)), lora_scaling));
}

void Linear::add_lora(std::int64_t r, double alpha, double dropout, RngState draw) {
  REMAT_CHECK(!has_lora(), Error, "Linear::add_lora: this Linear already has an adapter");
  REMAT_CHECK(r >= 1 && alpha > 0 && dropout >= 0 && dropout < 1, Error, "Linear::add_lora: expected r >= 1, alpha > 0 "
              "and dropout in [0, 1), got r=", r, ", alpha=", alpha, ", dropout=", dropout);
  const std::int64_t in = weight.size(1), out = weight.size(0);
  const Device device = weight.device();
  CategoryScope cat(MemoryCategory::parameter);
  NoGradGuard ng;
  Tensor a = empty({r, in}, TensorOptions(DType::f32, device.is_meta() ? device : kCPU));
  if (!device.is_meta()) {
    philox_fill_uniform(a.data<float>(), a.numel(), draw);
    const double bound = 1.0 / std::sqrt(double(in));  // kaiming_uniform_(a=sqrt(5)): gain sqrt(1/3) * sqrt(3 / in)
    float* p = a.data<float>();
    for (std::int64_t i = 0; i < a.numel(); ++i) p[i] = float((2.0 * double(p[i]) - 1.0) * bound);
    if (!device.is_cpu()) a = a.to(device);
  }
  lora_A = register_parameter("lora_A.weight", a);
  lora_B = register_parameter("lora_B.weight", zeros({out, r}, TensorOptions(DType::f32, device)));
  lora_scaling = alpha / double(r);
  lora_dropout = dropout;
}

Embedding::Embedding(std::int64_t vocab, std::int64_t dim, double init_std, Generator& gen) {
  weight = register_parameter("weight", init_normal({vocab, dim}, init_std, gen));
}

Tensor Embedding::forward(const Tensor& ids) const { return embedding(weight, ids); }

RMSNorm::RMSNorm(std::int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", init_constant({dim}, InitRecipe::Kind::ones));
}

Tensor RMSNorm::weight_for(const Tensor& x) const { return weight_as(tp ? tp->replicated(weight) : weight, x); }

Tensor RMSNorm::forward(const Tensor& x) const { return rms_norm(x, weight_for(x), eps); }

SelfAttention::SelfAttention(const ModelConfig& c, Generator& gen)
    : n_heads(c.n_heads), n_kv_heads(c.num_kv_heads()), head_dim(c.head_dim()), rope_theta(c.rope_theta) {
  const std::int64_t q_out = n_heads * head_dim, kv_out = n_kv_heads * head_dim;
  q_proj = register_module("q_proj", std::make_shared<Linear>(c.d_model, q_out, c.init_std, gen, c.qkv_bias));
  k_proj = register_module("k_proj", std::make_shared<Linear>(c.d_model, kv_out, c.init_std, gen, c.qkv_bias));
  v_proj = register_module("v_proj", std::make_shared<Linear>(c.d_model, kv_out, c.init_std, gen, c.qkv_bias));
  o_proj = register_module("o_proj", std::make_shared<Linear>(q_out, c.d_model, c.init_std, gen, c.o_bias));
}

Tensor SelfAttention::core(const Tensor& q, const Tensor& k, const Tensor& v) const {
  Tensor qr = rotary_embedding(q, rope_theta);
  Tensor kr = rotary_embedding(k, rope_theta);
  Tensor o = scaled_dot_product_attention(qr, kr, v, /*causal=*/true);  // [B, H, S, Dh]
  const std::int64_t B = o.size(0), S = o.size(2);
  return o.transpose(1, 2).reshape({B, S, n_heads * head_dim});
}

Tensor SelfAttention::project_kv(const Linear& proj, const Tensor& x) const {
  if (!tp || !tp->kv_group) return proj.forward(x);
  const Tensor w = weight_as(tp->kv_shared(proj.weight), x);
  return proj.bias.defined() ? linear(x, w, weight_as(tp->kv_shared(proj.bias), x)) : linear(x, w);
}

namespace {
// Sequence parallelism: a column-parallel region's projections of this
// rank's piece x of the sequence (sp_column_linears: the piece is what they
// keep for backward, which gathers it again), each plus its bias.
std::vector<Tensor> sp_projections(const TensorParallel& tp, const Tensor& x, const std::vector<const Linear*>& projs,
                                   const std::vector<bool>& kv_shared) {
  std::vector<Tensor> weights;
  for (std::size_t i = 0; i < projs.size(); ++i)
    weights.push_back(weight_as(kv_shared[i] ? tp.kv_shared(projs[i]->weight) : projs[i]->weight, x));
  std::vector<Tensor> ys = sp_column_linears(tp.group, x, weights);
  for (std::size_t i = 0; i < projs.size(); ++i)
    if (const Tensor& b = projs[i]->bias; b.defined())
      ys[i] = add(ys[i], weight_as(kv_shared[i] ? tp.kv_shared(b) : b, x));
  return ys;
}
}  // namespace

Tensor SelfAttention::forward(const Tensor& x_in, const PartRunner& parts) const {
  const std::int64_t B = x_in.size(0), S = tp && tp->sp ? x_in.size(1) * tp->size() : x_in.size(1);
  auto heads = [&](const Tensor& t, std::int64_t h) {
    return t.view({B, S, h, head_dim}).transpose(1, 2).contiguous();  // [B, h, S, Dh]
  };
  if (tp && tp->sp) {
    const std::vector<Tensor> qkv = sp_projections(*tp, x_in, {q_proj.get(), k_proj.get(), v_proj.get()},
                                                   {false, true, true});
    return attend(heads(qkv[0], n_heads), heads(qkv[1], n_kv_heads), heads(qkv[2], n_kv_heads), parts);
  }
  const Tensor x = tp ? tp->enter(x_in) : x_in;
  Tensor q = heads(q_proj->forward(x), n_heads);
  Tensor k = heads(project_kv(*k_proj, x), n_kv_heads);
  Tensor v = heads(project_kv(*v_proj, x), n_kv_heads);
  return attend(q, k, v, parts);
}

Tensor SelfAttention::attend(const Tensor& q, const Tensor& k, const Tensor& v, const PartRunner& parts) const {
  Tensor o = parts.run("core_attn", [this](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{core(in[0], in[1], in[2])};
  }, {q, k, v})[0];
  if (!tp) return o_proj->forward(o);
  const Tensor y = tp->leave(linear(o, weight_as(o_proj->weight, o)));
  return o_proj->bias.defined() ? add(y, weight_as(tp->replicated(o_proj->bias), y)) : y;
}

Tensor SelfAttention::forward_cached(const Tensor& x, Tensor& k_cache, Tensor& v_cache) const {
  REMAT_CHECK(x.dim() == 3, ShapeError, "SelfAttention::forward_cached: x must be [batch, seq, d], got ",
              shape_str(x.sizes()));
  const std::int64_t B = x.size(0), S = x.size(1);
  const std::int64_t past = k_cache.defined() ? k_cache.size(2) : 0;
  auto heads = [&](const Tensor& t, std::int64_t h) {
    return t.view({B, S, h, head_dim}).transpose(1, 2).contiguous();
  };
  Tensor q = rotary_embedding(heads(q_proj->forward(x), n_heads), rope_theta, past);
  Tensor k = rotary_embedding(heads(k_proj->forward(x), n_kv_heads), rope_theta, past);
  Tensor v = heads(v_proj->forward(x), n_kv_heads);
  k_cache = past ? cat({k_cache, k}, 2) : k;
  v_cache = past ? cat({v_cache, v}, 2) : v;
  Tensor o;
  if (past == 0) {
    o = scaled_dot_product_attention(q, k, v, /*causal=*/true);
  } else {
    // The new rows against every cached key: [B, H, S, T] (grouped-query:
    // each key/value head repeated for the query heads it serves).
    const std::int64_t T = k_cache.size(2), group = n_heads / n_kv_heads;
    auto per_query_head = [&](const Tensor& t) {
      if (group == 1) return t;
      return t.view({B, n_kv_heads, 1, T, head_dim}).expand({B, n_kv_heads, group, T, head_dim})
          .reshape({B, n_heads, T, head_dim});
    };
    const Tensor kq = per_query_head(k_cache), vq = per_query_head(v_cache);
    Tensor scores = mul(matmul(q, kq.transpose(2, 3).contiguous()), 1.0 / std::sqrt(double(head_dim)));
    if (S > 1) {  // row s sits at position past + s: keys after it are masked
      std::vector<float> mask(std::size_t(S * T), 0.0f);
      for (std::int64_t r = 0; r < S; ++r)
        for (std::int64_t j = past + r + 1; j < T; ++j) mask[std::size_t(r * T + j)] = -1e30f;
      Tensor m = from_vector<float>(mask, {S, T}, scores.device());
      scores = add(scores, m.dtype() == scores.dtype() ? m : cast(m, scores.dtype()));
    }
    o = matmul(softmax(scores, -1), vq);
  }
  return o_proj->forward(o.transpose(1, 2).reshape({B, S, n_heads * head_dim}));
}

MLP::MLP(std::int64_t d_model, std::int64_t hidden, double init_std, Generator& gen, const MLPNames& names) {
  gate_proj = register_module(names.gate, std::make_shared<Linear>(d_model, hidden, init_std, gen));
  up_proj = register_module(names.up, std::make_shared<Linear>(d_model, hidden, init_std, gen));
  down_proj = register_module(names.down, std::make_shared<Linear>(hidden, d_model, init_std, gen));
}

Tensor MLP::forward(const Tensor& x) const {
  if (tp && tp->sp) {
    const std::vector<Tensor> gu = sp_projections(*tp, x, {gate_proj.get(), up_proj.get()}, {false, false});
    return tp->leave(down(gu[0], gu[1]));
  }
  const Tensor whole = tp ? tp->enter(x) : x;
  Tensor g = gate_proj->forward(whole);  // (gate before up)
  Tensor u = up_proj->forward(whole);
  return tp ? tp->leave(down(std::move(g), std::move(u))) : down(std::move(g), std::move(u));
}

Tensor MLP::down(Tensor g, Tensor u) const {
  if (!recompute_activation) {
    const Tensor a = swiglu(g, u);
    // From here g and u are swiglu's saves alone, so dynamic remat may evict
    // them while the down projection allocates.
    g = Tensor();
    u = Tensor();
    return down_proj->forward(a);
  }
  DiscardedOutput act("moe_act", [](const std::vector<Tensor>& in) { return swiglu(in[0], in[1]); }, {g, u});
  SavedTensorHooksScope scope(act.hooks());
  return down_proj->forward(act.output());
}

}  // namespace remat
