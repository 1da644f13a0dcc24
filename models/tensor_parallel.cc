#include "models/tensor_parallel.h"

#include <regex>
#include <sstream>
#include <vector>

#include "engine/allocator.h"
#include "engine/grad_mode.h"
#include "ops/join.h"

namespace remat {

namespace {
// "model.layers.<i>.<rest>" -> i and rest (false for other names).
bool block_parameter(const std::string& name, std::int64_t& layer, std::string& rest) {
  static const std::regex re(R"(model\.layers\.(\d+)\.(.+))");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return false;
  layer = std::stoll(m[1]);
  rest = m[2];
  return true;
}
}  // namespace

TpSlice tp_slice(const ModelConfig& c, const std::string& name, std::int64_t ranks, std::int64_t rank) {
  const TpSlice whole{0, 1, 0}, by_rank{0, ranks, rank};
  if (ranks <= 1) return whole;
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight") return by_rank;
  std::int64_t layer = 0;
  std::string rest;
  if (!block_parameter(name, layer, rest)) return whole;
  if (rest == "self_attn.q_proj.weight" || rest == "self_attn.q_proj.bias") return by_rank;
  if (rest == "self_attn.o_proj.weight") return {1, ranks, rank};
  if (rest.rfind("self_attn.k_proj.", 0) == 0 || rest.rfind("self_attn.v_proj.", 0) == 0) {
    const std::int64_t kv = c.num_kv_heads();
    return kv >= ranks ? by_rank : TpSlice{0, kv, rank * kv / ranks};
  }
  if (c.is_moe_layer(layer)) return whole;
  if (rest == "mlp.gate_proj.weight" || rest == "mlp.up_proj.weight") return by_rank;
  if (rest == "mlp.down_proj.weight") return {1, ranks, rank};
  return whole;
}

void check_tensor_parallel(const ModelConfig& c, std::int64_t t, bool sp) {
  REMAT_CHECK(!sp || t >= 2, Error, "--sp shards the sequence over the tensor-parallel ranks: give --tp T with T >= 2");
  if (t <= 1) return;
  std::vector<std::string> bad;
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) bad.push_back(what);
  };
  const std::int64_t kv = c.num_kv_heads();
  need(c.n_heads % t == 0, "the " + std::to_string(c.n_heads) + " attention heads");
  need(kv % t == 0 || t % kv == 0, "the " + std::to_string(kv) + " key/value heads (T must divide them or be a multiple)");
  bool dense = false;
  for (std::int64_t i = 0; i < c.n_layers; ++i) dense = dense || !c.is_moe_layer(i);
  if (dense) need(c.ffn % t == 0, "the FFN width " + std::to_string(c.ffn));
  need(c.vocab % t == 0, "the vocabulary of " + std::to_string(c.vocab));
  if (sp) need(c.seq % t == 0, "the sequence of " + std::to_string(c.seq) + " positions (--sp)");
  if (!bad.empty()) {
    std::ostringstream m;
    m << "--tp " << t << ": config " << c.name << " does not split into " << t << " tensor-parallel ranks: ";
    for (std::size_t i = 0; i < bad.size(); ++i) m << (i ? ", " : "") << bad[i];
    m << " must divide by " << t;
    throw Error(m.str());
  }
}

std::shared_ptr<ProcessGroup> kv_head_group(const ModelConfig& c, const std::shared_ptr<ProcessGroup>& group) {
  const std::int64_t t = group->size(), kv = c.num_kv_heads();
  if (t <= 1 || kv >= t) return nullptr;
  const std::int64_t share = t / kv;  // ranks per key/value head
  return group->split_by([share](int r) { return std::pair<int, int>(int(r / share), int(r % share)); });
}

TensorParallelJob split_tensor_parallel(const std::shared_ptr<ProcessGroup>& job, const ModelConfig& c,
                                        std::int64_t ranks, bool sp) {
  check_tensor_parallel(c, ranks, sp);
  if (ranks <= 1) return {nullptr, job};
  const int T = int(ranks);
  REMAT_CHECK(job->size() % T == 0, Error, "--tp ", T, ": the job has ", job->size(), " rank(s), not a multiple of ", T,
              " (start it with `mpirun -np N` for N = --tp x the data-parallel ranks)");
  auto tp = std::make_shared<TensorParallel>();
  tp->group = job->split_by([T](int r) { return std::pair<int, int>(r / T, r % T); });
  auto rest = job->split_by([T](int r) { return std::pair<int, int>(r % T, r / T); });
  tp->kv_group = kv_head_group(c, tp->group);
  tp->sp = sp;
  return {tp, rest};
}

std::int64_t whole_parameters(const DecoderModel& model) {
  const auto& tp = model.tensor_parallel();
  std::int64_t n = 0;
  for (const auto& [name, p] : model.named_parameters())
    n += p.numel() * (tp ? tp_slice(model.config(), name, tp->size(), tp->rank()).parts : 1);
  return n;
}

Tensor tp_take_slice(const Tensor& whole, const TpSlice& s) {
  if (!s.split()) return whole;
  const std::int64_t n = whole.size(s.dim) / s.parts;
  return whole.narrow(s.dim, s.index * n, n).clone();  // (its own elements: a view would keep the whole alive)
}

void for_each_slice_run(const Shape& whole, const TpSlice& s, std::int64_t begin, std::int64_t n,
                        const std::function<void(std::int64_t, std::int64_t, std::int64_t)>& fn) {
  std::int64_t row = 1;  // a whole row: the elements of dims [dim, end)
  for (std::size_t i = std::size_t(s.dim); i < whole.size(); ++i) row *= whole[i];
  const std::int64_t piece = row / s.parts;  // a slice row's elements
  for (std::int64_t done = 0; done < n;) {
    const std::int64_t e = begin + done, r = e / piece, c = e % piece, run = std::min(piece - c, n - done);
    fn(r * row + s.index * piece + c, e, run);
    done += run;
  }
}

Tensor tp_whole(ProcessGroup& group, const Tensor& slice, const TpSlice& s) {
  if (!s.split()) return slice;
  const std::int64_t t = group.size();
  const Tensor front = s.dim == 0 ? slice.detach().contiguous() : slice.detach().transpose(0, s.dim).contiguous();
  const Tensor all = group.all_gather(front);  // [t * rows, ...]: rank r's at rows r * rows
  const std::int64_t rows = front.size(0);
  std::vector<Tensor> parts;
  for (std::int64_t i = 0; i < s.parts; ++i) parts.push_back(all.narrow(0, i * (t / s.parts) * rows, rows));
  const Tensor joined = cat(parts, 0);
  return s.dim == 0 ? joined : joined.transpose(0, s.dim).contiguous();
}

void apply_tensor_parallel(DecoderModel& model, std::shared_ptr<const TensorParallel> tp) {
  const ModelConfig& c = model.config();
  const std::int64_t t = tp->size(), rank = tp->rank();
  {
    NoGradGuard ng;
    CategoryScope cat(MemoryCategory::parameter);
    for (auto& [name, p] : model.named_parameters())
      if (const TpSlice s = tp_slice(c, name, t, rank); s.split()) p.reshape_storage_(tp_take_slice(p, s));
  }
  for (const auto& layer : model.model->layers) {
    layer->tp = tp;
    layer->input_layernorm->tp = tp;
    layer->post_attention_layernorm->tp = tp;
    SelfAttention& a = *layer->self_attn;
    a.tp = tp;
    a.n_heads = c.n_heads / t;
    a.n_kv_heads = c.num_kv_heads() >= t ? c.num_kv_heads() / t : 1;
    if (layer->mlp) layer->mlp->tp = tp;
  }
  model.model->norm->tp = tp;
  model.set_tensor_parallel(tp, rank * (c.vocab / t));
}

}  // namespace remat
